-- @include "setMessageStatus"
-- Completes a `sending` message whose fan-out is done (`fanout` = done: every delivery exists) and
-- none of whose deliveries is still pending. Returns the message status afterwards.
local function completeWhenSettled(record, base, id, at)
  local status = redis.call('HGET', record, 'status')
  if status == 'sending' and redis.call('HGET', record, 'fanout') == 'done' and tonumber(redis.call('HGET', record, 'n:pending') or '0') <= 0 then
    setMessageStatus(record, base, id, 'sending', 'completed')
    redis.call('HSET', record, 'completedAt', at)
    return 'completed'
  end
  return status
end
