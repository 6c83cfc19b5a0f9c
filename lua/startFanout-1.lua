--[[
  Starts or resumes the fan-out of one or more messages of a tenant in one call: a `queued` message
  becomes `sending` (its status index moved, `startedAt` set); any other is left as it is. Returns
  each message's record afterwards, in the order of the ids (HGETALL, flat; empty for an unknown
  message), which tells the dispatcher whether and where to go on.

  KEYS[1] the first message's record ({t}:msg:<id>): names the tenant's slot; every record is built
          from the tenant key base as streams/keys.ts `message` builds it
  ARGV[1] tenant key base ({t} with the key prefix)
  ARGV[2] now (ISO 8601)
  ARGV[3..] message ids
]]
-- @include "setMessageStatus"
local rcall = redis.call
local base, at = ARGV[1], ARGV[2]
local out = {}
for i = 3, #ARGV do
  local id = ARGV[i]
  local record = base .. ':msg:' .. id
  if rcall('HGET', record, 'status') == 'queued' then
    setMessageStatus(record, base, id, 'queued', 'sending')
    rcall('HSET', record, 'startedAt', at, 'updatedAt', at)
  end
  out[#out + 1] = rcall('HGETALL', record)
end
return out
