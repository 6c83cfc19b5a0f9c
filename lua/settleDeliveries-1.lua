--[[
  Records the outcomes of pending deliveries of one or more messages of a tenant (sent, failed or
  canceled), each once, keeping each message's counts and status indexes exact; completes a message
  when its fan-out is done and nothing is pending any more.

  KEYS[1] the first message's record ({t}:msg:<msgId>): names the tenant's slot; records, delivery
          records and indexes are built from the tenant key base as streams/keys.ts builds them

  ARGV[1] tenant key base ({t} with the key prefix)
  ARGV[2] now (ISO 8601)
  ARGV[3] number of messages M, then per message: its id, the number of deliveries D, then D groups:
          delivery id, new status, F, then F field/value pairs

  Returns the number of deliveries recorded (those not pending any more are left alone).
]]
-- @include "completeWhenSettled"
local rcall = redis.call
local base, at = ARGV[1], ARGV[2]
local total = 0
local i = 4
for _ = 1, tonumber(ARGV[3]) do
  local msg, n = ARGV[i], tonumber(ARGV[i + 1])
  local record, index = base .. ':msg:' .. msg, base .. ':msg-dlv:' .. msg
  i = i + 2
  local recorded, byStatus = 0, {}
  for _ = 1, n do
    local id, to, f = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
    local key = base .. ':dlv:' .. id
    if rcall('HGET', key, 'status') == 'pending' then
      local fields = { 'status', to, 'updatedAt', at }
      for k = 0, f - 1 do
        fields[#fields + 1] = ARGV[i + 3 + 2 * k]
        fields[#fields + 1] = ARGV[i + 4 + 2 * k]
      end
      rcall('HSET', key, unpack(fields))
      rcall('ZREM', index .. ':pending', id)
      -- it keeps its place (its score in the message's index: lua/createDeliveries)
      rcall('ZADD', index .. ':' .. to, rcall('ZSCORE', index, id) or 0, id)
      byStatus[to] = (byStatus[to] or 0) + 1
      recorded = recorded + 1
    end
    i = i + 3 + 2 * f
  end
  if recorded > 0 then
    for status, count in pairs(byStatus) do rcall('HINCRBY', record, 'n:' .. status, count) end
    rcall('HINCRBY', record, 'n:pending', -recorded)
    rcall('HSET', record, 'updatedAt', at)
    completeWhenSettled(record, base, msg, at)
  end
  total = total + recorded
end
return total
