--[=[
  Commits what the automation step (actors/automation.ts) computed for the subscribers of one
  partition batch: for each subscriber, a compare-and-set on its automation state version, then its
  engine events (`$run.*`, appended to the inbox with the next sequences) and its record operations
  (segment memberships, counters, runs, timers), all atomically. A subscriber whose version moved
  (another worker took the partition over and committed first) is left untouched.

  KEYS[1] partition inbox ({pN}:in)
  KEYS[2] sequence hash   ({pN}:seq)
  KEYS[3] subscriber hash ({pN}:subs)
  KEYS[4] partition lease ({pN}:lease:worker)
  KEYS[5] the partition's deleted segments ({pN}:segs-gone, zset `<tenant>|<segment id>`,
          lua/dropSegmentMembers)

  ARGV[1] now (ms)
  ARGV[2] the subscribers' commits, one JSON array (one argument instead of four per operation:
          the worker encodes it with one JSON.stringify, this script decodes it with one
          cjson.decode), each commit an array:
    [tenant id, workspace id, externalId, automation-state key, expected version,
     events: [[evt id, name, data (JSON text), runId, messageId, step], ...],
     operations: [[op, key, a, b], ...]]
      every operation value is a string; key '' is the commit's automation-state key
      (hset key field value | hdel key field - | del key - - | sadd key member - | srem key member -
       | zadd key score member | zrem key member - | hincrby key field by | pexpireat key ms -
       | segjoin key segmentId member | segs '' idsJSON - | hsetx key field value)
      `segjoin` adds a member to a segment's member set and `segs` sets the subscriber's segment
      ids, both leaving out a segment deleted since the worker loaded its definitions (listed in
      KEYS[5] by the delete): such a commit added members after the delete removed them, left
      for good (probe EF); `hsetx` sets a field of a hash that still exists only (an ended run's
      chain count: a retention sweep between the worker's read and this commit removed the run, which
      an HSET made again as a bare hash, kept for good: probe P2)

  ARGV[3] the committing worker's owner id: nothing is committed unless it holds the partition's
          lease (a worker that stalled past its lease and resumed must not commit what it computed
          from a state its successor moves on from; lua/applyEvents has the same fence)

  The automation state also keeps the subscriber's engine range (`ea`, `eb`, `er`, below).

  Returns one 1 (applied) or 0 (version mismatch, skipped) per subscriber, in order; -1 (nothing
  committed) when the caller does not hold the lease.
]=]
-- @include "appendInboxEvent"
-- @include "applyOp"
local rcall = redis.call
if rcall('GET', KEYS[4]) ~= ARGV[3] then return -1 end
local nowMs = ARGV[1]

local function segmentGone(tenant, id)
  return rcall('ZSCORE', KEYS[5], tenant .. '|' .. id) ~= false
end

-- the subscriber's segment ids without the deleted ones (the JSON as sent when none is)
local function liveSegments(tenant, json)
  local ids, kept, dropped = cjson.decode(json), {}, false
  for _, id in ipairs(ids) do
    if segmentGone(tenant, id) then dropped = true else kept[#kept + 1] = id end
  end
  if not dropped then return json end
  -- cjson writes an empty table as {}; `segs` is a JSON array
  return #kept == 0 and '[]' or cjson.encode(kept)
end
local out = {}
for s, c in ipairs(cjson.decode(ARGV[2])) do
  local tenant, workspace, externalId, autoKey, expected, events, ops = c[1], c[2], c[3], c[4], tonumber(c[5]), c[6], c[7]
  local version = tonumber(rcall('HGET', autoKey, 'v') or '0')
  if version == expected then
    local field = tenant .. '|' .. externalId
    local sub = rcall('HGET', KEYS[3], field)
    -- a deleted subscriber gets no more events (writing one would not recreate it)
    local first, last, runOf
    if sub and #events > 0 then
      runOf = events[1][4]
      for _, e in ipairs(events) do
        local seq = rcall('HINCRBY', KEYS[2], field, 1)
        first = first or seq
        last = seq
        if e[4] ~= runOf then runOf = '' end
        appendInboxEvent(KEYS[1], { t = tenant, w = workspace, id = e[1], q = seq, x = externalId, u = sub, n = e[2], o = 'system',
          ts = nowMs, r = nowMs, d = e[3], ru = e[4], m = e[5], st = e[6] })
      end
    end
    for _, op in ipairs(ops) do
      local name, key = op[1], op[2] == '' and autoKey or op[2]
      if name == 'segjoin' then
        if not segmentGone(tenant, op[3]) then rcall('ZADD', key, 0, op[4]) end
      elseif name == 'hsetx' then
        if rcall('EXISTS', key) == 1 then rcall('HSET', key, op[3], op[4]) end
      elseif name == 'segs' then
        rcall('HSET', key, 'segs', liveSegments(tenant, op[3]))
      else
        local failed = applyOp(name, key, op[3], op[4])
        if failed then return failed end
      end
    end
    if first then
      -- the subscriber's engine range: `ea`..`eb` are sequences this script issued one after the
      -- other with no event from elsewhere between them, all of run `er` ('' when of several or of
      -- none); a due timer of that run need not wait for them (actors/timer-order.ts)
      local range = rcall('HMGET', autoKey, 'ea', 'eb', 'er')
      if range[2] == tostring(first - 1) then
        rcall('HSET', autoKey, 'eb', last, 'er', range[3] == runOf and runOf or '')
      else
        rcall('HSET', autoKey, 'ea', first, 'eb', last, 'er', runOf)
      end
    end
    rcall('HINCRBY', autoKey, 'v', 1)
    out[s] = 1
  else
    out[s] = 0
  end
end
return out
