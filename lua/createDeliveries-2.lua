--[[
  Creates a message's deliveries for one chunk of its audience, each at most once (ids are derived
  from the message and the subscription), keeping the message's counts and the status indexes exact.

  KEYS[1] the message record ({t}:msg:<id>)        counts n:total, n:<status>
  KEYS[2] the message's delivery index ({t}:msg-dlv:<msgId>)

  ARGV[1] tenant key base ({t} with the key prefix): delivery records and status indexes are built from it
  ARGV[2] message id
  ARGV[3] '' for a chunk of a longer audience; for the whole audience (a message to one subscriber), now
          (ISO 8601): the fan-out is then marked done as lua/finishFanout does, in the same call
  ARGV[4] number of deliveries D, then D groups of 3: delivery id, status (pending|skipped), fields (JSON object of strings)

  Returns one { id, status } per delivery: its status now (an existing delivery keeps its own).
]]
-- @include "completeWhenSettled"
local rcall = redis.call
local base, msg = ARGV[1], ARGV[2]
local out, created = {}, {}
local n = tonumber(ARGV[4])
for i = 0, n - 1 do
  local id, status, fields = ARGV[5 + 3 * i], ARGV[6 + 3 * i], cjson.decode(ARGV[7 + 3 * i])
  local key = base .. ':dlv:' .. id
  local existing = rcall('HGET', key, 'status')
  if existing then
    out[#out + 1] = { id, existing }
  else
    local flat = { 'status', status }
    for field, value in pairs(fields) do
      flat[#flat + 1] = field
      flat[#flat + 1] = value
    end
    rcall('HSET', key, unpack(flat))
    rcall('ZADD', KEYS[2], 0, id)
    rcall('ZADD', base .. ':msg-dlv:' .. msg .. ':' .. status, 0, id)
    created[status] = (created[status] or 0) + 1
    out[#out + 1] = { id, status }
  end
end
-- the counts once per status, not once per delivery
local total = 0
for status, count in pairs(created) do
  rcall('HINCRBY', KEYS[1], 'n:' .. status, count)
  total = total + count
end
if total > 0 then rcall('HINCRBY', KEYS[1], 'n:total', total) end
if ARGV[3] ~= '' then
  rcall('HSET', KEYS[1], 'fanout', 'done', 'cursor', 'done', 'updatedAt', ARGV[3])
  completeWhenSettled(KEYS[1], base, msg, ARGV[3])
end
return out
