--[[
  Starts or resumes a message's fan-out in one call: a `queued` message becomes `sending` (its
  status index moved, `startedAt` set); any other is left as it is. Returns the record afterwards
  (HGETALL, flat; empty for an unknown message), which tells the dispatcher whether and where to go on.

  KEYS[1] the message record ({t}:msg:<id>)

  ARGV[1] tenant key base ({t} with the key prefix)
  ARGV[2] message id
  ARGV[3] now (ISO 8601)
]]
-- @include "setMessageStatus"
local rcall = redis.call
if rcall('HGET', KEYS[1], 'status') == 'queued' then
  setMessageStatus(KEYS[1], ARGV[1], ARGV[2], 'queued', 'sending')
  rcall('HSET', KEYS[1], 'startedAt', ARGV[3], 'updatedAt', ARGV[3])
end
return rcall('HGETALL', KEYS[1])
