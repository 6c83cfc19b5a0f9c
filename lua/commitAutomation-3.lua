--[[
  Commits what the automation step (actors/automation.ts) computed for the subscribers of one
  partition batch: for each subscriber, a compare-and-set on its automation state version, then its
  engine events (`$run.*`, appended to the inbox with the next sequences) and its record operations
  (segment memberships, counters, runs, timers), all atomically. A subscriber whose version moved
  (another worker took the partition over and committed first) is left untouched.

  KEYS[1] partition inbox ({pN}:in)
  KEYS[2] sequence hash   ({pN}:seq)
  KEYS[3] subscriber hash ({pN}:subs)

  ARGV[1] now (ms)
  ARGV[2] number of subscribers S, then per subscriber:
    tenant id, workspace id, externalId, automation-state key, expected version,
    number of events E, then E groups of 7: evt id, name, data (JSON), runId, messageId, step, '-',
    number of operations O, then O groups of 4: op, key, a, b
      (hset key field value | hdel key field - | del key - - | sadd key member - | srem key member -
       | zadd key score member | zrem key member - | hincrby key field by | pexpireat key ms -)

  Returns one 1 (applied) or 0 (version mismatch, skipped) per subscriber, in order.
]]
-- @include "appendInboxEvent"
-- @include "applyOp"
local rcall = redis.call
local nowMs = ARGV[1]
local out = {}
local i = 3
for s = 1, tonumber(ARGV[2]) do
  local tenant, workspace, externalId, autoKey, expected = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], tonumber(ARGV[i + 4])
  i = i + 5
  local version = tonumber(rcall('HGET', autoKey, 'v') or '0')
  local ok = version == expected
  local events = tonumber(ARGV[i])
  i = i + 1
  if ok then
    local field = tenant .. '|' .. externalId
    local sub = rcall('HGET', KEYS[3], field)
    for _ = 1, events do
      -- a deleted subscriber gets no more events (writing one would not recreate it)
      if sub then
        local seq = rcall('HINCRBY', KEYS[2], field, 1)
        appendInboxEvent(KEYS[1], { t = tenant, w = workspace, id = ARGV[i], q = seq, x = externalId, u = sub, n = ARGV[i + 1], o = 'system',
          ts = nowMs, r = nowMs, d = ARGV[i + 2], ru = ARGV[i + 3], m = ARGV[i + 4], st = ARGV[i + 5] })
      end
      i = i + 7
    end
  else
    i = i + events * 7
  end
  local ops = tonumber(ARGV[i])
  i = i + 1
  if ok then
    for _ = 1, ops do
      local failed = applyOp(ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3])
      if failed then return failed end
      i = i + 4
    end
    rcall('HINCRBY', autoKey, 'v', 1)
    out[s] = 1
  else
    i = i + ops * 4
    out[s] = 0
  end
end
return out
