-- Sets a message record's status from `current` to `to`, keeping the per-status indexes
-- ({t}:messages:<status>) exact. A message reaching an end (completed, canceled, failed) is noted in
-- {t}:msg-ended with the server's time (ms): the retention sweep expires its deliveries, and the
-- message too unless a caller's Idempotency-Key names it (lua/expireMessages).
local function setMessageStatus(record, base, id, current, to)
  redis.call('ZREM', base .. ':messages:' .. current, id)
  redis.call('ZADD', base .. ':messages:' .. to, 0, id)
  redis.call('HSET', record, 'status', to)
  if to == 'completed' or to == 'canceled' or to == 'failed' then
    local t = redis.call('TIME')
    redis.call('ZADD', base .. ':msg-ended', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000), id)
  end
end
