--[[
  Records the outcomes of pending deliveries of one message (sent, failed or canceled), each once,
  keeping the message's counts and status indexes exact; completes the message when its fan-out is
  done and nothing is pending any more.

  KEYS[1] the message record ({t}:msg:<msgId>)

  ARGV[1] tenant key base ({t} with the key prefix): delivery records and indexes are built from it
  ARGV[2] message id
  ARGV[3] now (ISO 8601)
  ARGV[4] number of deliveries D, then D groups: delivery id, new status, F, then F field/value pairs

  Returns the number of deliveries recorded (those not pending any more are left alone).
]]
-- @include "completeWhenSettled"
local rcall = redis.call
local base, msg, at = ARGV[1], ARGV[2], ARGV[3]
local recorded, byStatus = 0, {}
local i = 5
for _ = 1, tonumber(ARGV[4]) do
  local id, to, f = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  local key = base .. ':dlv:' .. id
  if rcall('HGET', key, 'status') == 'pending' then
    local fields = { 'status', to, 'updatedAt', at }
    for k = 0, f - 1 do
      fields[#fields + 1] = ARGV[i + 3 + 2 * k]
      fields[#fields + 1] = ARGV[i + 4 + 2 * k]
    end
    rcall('HSET', key, unpack(fields))
    rcall('ZREM', base .. ':msg-dlv:' .. msg .. ':pending', id)
    rcall('ZADD', base .. ':msg-dlv:' .. msg .. ':' .. to, 0, id)
    byStatus[to] = (byStatus[to] or 0) + 1
    recorded = recorded + 1
  end
  i = i + 3 + 2 * f
end
if recorded > 0 then
  for status, count in pairs(byStatus) do rcall('HINCRBY', KEYS[1], 'n:' .. status, count) end
  rcall('HINCRBY', KEYS[1], 'n:pending', -recorded)
  rcall('HSET', KEYS[1], 'updatedAt', at)
  completeWhenSettled(KEYS[1], base, msg, at)
end
return recorded
