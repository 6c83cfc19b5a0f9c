--[[
  Creates the deliveries of one chunk of audience of one or more messages of a tenant, each at most
  once (ids are derived from the message and the subscription), keeping each message's counts and
  the status indexes exact. A chunk of a longer audience is one message's; the dispatcher's batch of
  one-subscriber messages is many, each with its whole audience.

  KEYS[1] the first message's record ({t}:msg:<id>): names the tenant's slot; records
          ({t}:msg:<id>, counts n:total, n:<status>), delivery indexes ({t}:msg-dlv:<id>), delivery
          records and status indexes are built from the tenant key base as streams/keys.ts builds them
  ARGV[1] tenant key base ({t} with the key prefix)
  ARGV[2] '' for a chunk of a longer audience; for whole audiences (messages to one subscriber), now
          (ISO 8601): each message's fan-out is then marked done as lua/finishFanout does, in the same call
  ARGV[3] the deliveries' createdAt in ms: a delivery's score in its message's indexes is that ms × 1000
          + the order it was made in by this call (streams/scored-index.ts: the list is newest first;
          delivery ids are derived from message and subscription, so they carry no order; probe CF)
  ARGV[4] number of messages M, then per message: its id, the number of deliveries D, and D groups of
          3: delivery id, status (pending|skipped), fields (JSON object of strings)
  Returns per message, in order, one { id, status } per delivery: its status now (an existing
  delivery keeps its own).
]]
-- @include "completeWhenSettled"
local rcall = redis.call
local base, whole, ms = ARGV[1], ARGV[2], ARGV[3]
local replies = {}
local made = 0
local i = 5
for _ = 1, tonumber(ARGV[4]) do
  local msg, n = ARGV[i], tonumber(ARGV[i + 1])
  local record, index = base .. ':msg:' .. msg, base .. ':msg-dlv:' .. msg
  i = i + 2
  local out, created = {}, {}
  for _ = 1, n do
    local id, status, fields = ARGV[i], ARGV[i + 1], cjson.decode(ARGV[i + 2])
    i = i + 3
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
      -- the score as text: a Lua number prints 16 digits in exponent form
      local score = ms .. string.format('%03d', math.min(made, 999))
      made = made + 1
      rcall('ZADD', index, score, id)
      rcall('ZADD', index .. ':' .. status, score, id)
      created[status] = (created[status] or 0) + 1
      out[#out + 1] = { id, status }
    end
  end
  -- the counts once per status, not once per delivery
  local total = 0
  for status, count in pairs(created) do
    rcall('HINCRBY', record, 'n:' .. status, count)
    total = total + count
  end
  if total > 0 then rcall('HINCRBY', record, 'n:total', total) end
  if whole ~= '' then
    rcall('HSET', record, 'fanout', 'done', 'cursor', 'done', 'updatedAt', whole)
    completeWhenSettled(record, base, msg, whole)
  end
  replies[#replies + 1] = out
end
return replies
