--[[
  The subscriber actor's step for a batch of partition-inbox entries: for each event not yet
  applied (its sequence above the subscriber's last applied one), update every read model of the
  partition, then record the sequence, all in one atomic call, so a redelivered entry is skipped
  and no effect happens twice.

  Cost: a call costs a fixed part plus a part per event, both in Redis's one thread. Per event only
  the tenant-log XADD is its own command; everything else is gathered in Lua tables while the batch
  is walked and written once per key (or field) at the end: timeline ZADDs per subscriber, catalog
  counts and first/last per name, volume counts and HyperLogLog members per bucket, the applied
  sequences in one HSET. Volume and distinct-subscriber buckets get their expiry when created (it is
  fixed by the bucket's hour or day), not on every write. Measured with `npm run bench -- scripts`.

  KEYS[1] applied hash        ({pN}:applied)  field tenant|externalId -> last applied sequence
  KEYS[2] partition tenants   ({pN}:tenants)  zset of tenant ids with data here, score = last write ms
  KEYS[3] partition inbox     ({pN}:in)       the entries, read here by id (the caller sends ids, not
                                              the events again: half the bytes of a batch)
  KEYS[4] partition lease     ({pN}:lease:worker) the worker holding the partition

  ARGV[1] partition key base ({pN} with the key prefix); read-model keys are built from it with the
          suffixes of streams/keys.ts (tenantLog, timeline, catalog, volume, uniques, samples)
  ARGV[2] retention (ms)
  ARGV[3] now (ms)
  ARGV[4] number of entries N
  then N inbox entry ids, in stream order; an entry gone from the inbox, or a timer entry, is skipped
  (inbox fields used: t, x, id, q, u, n, o, ts, r, d, c, ru, m, st, pv, tc, and k to skip timers)
  then, the guard of a worker's batch ('' each for a caller outside a consumer group: tests, benches):
  ARGV[5 + N] the worker's owner id: nothing is applied unless it holds the partition's lease
  ARGV[6 + N] the consumer group of the inbox
  ARGV[7 + N] the id of the batch's first entry (timers included): nothing is applied while an
              entry of the inbox older than it is pending in the group (read by a worker that lost
              the lease meanwhile, or left by a failed batch)
  An event sent with the caller's id gets its dedupe entry ({pN}:dedupe, see lua/ingestEvents)
  pointed at its tenant-log entry instead of the inbox entry.

  Why the guard: an event is applied only when its sequence is above the subscriber's last applied
  one, so the entries of a partition must be applied in stream order, by one worker. A worker that
  stalled past its lease (a long GC, SIGSTOP) and resumed could go on reading and applying entries of
  the partition its successor now reads: entries applied out of order, the earlier ones then skipped
  as if already applied (probe S2: 8 of 22,500 events missing from the read models after a 2.5 s
  stall). With the guard the stale worker applies nothing, and the holder applies nothing past an
  entry still pending elsewhere: it claims such entries and applies them first.

  Returns the number of entries applied (the rest were already applied), -1 when the caller does
  not hold the lease, -2 when an older entry is pending.
]]
-- @include "dedupeField"
local rcall = redis.call
local base, retention, nowMs = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local HOUR, DAY = 3600000, 86400000
local HOUR_COUNTS_KEPT = 32 * DAY
local SAMPLES = 20
-- a timeline drops its entries older than the retention every TRIM_EVERY events (reads skip them
-- anyway: their tenant-log entries are trimmed), up to TRIM_MOST at a time
local TRIM_EVERY, TRIM_MOST = 8, 16
-- Lua turns a number into text (`..`, tostring) through sprintf("%.14g"), ~1.5 µs each: numbers
-- are written as the text they arrived as, and the few computed ones (bucket starts, a log id's
-- milliseconds) through `decimal`, once per distinct value of the call
local decimals = {}
local function decimal(n)
  local s = decimals[n]
  if not s then
    s = string.format('%d', n)
    decimals[n] = s
  end
  return s
end
local trimBelow = decimal(nowMs - retention)
local dedupeKey = base .. ':dedupe'
local n = tonumber(ARGV[4])
local leaseOwner, group, firstId = ARGV[5 + n], ARGV[6 + n], ARGV[7 + n]
if leaseOwner ~= '' and rcall('GET', KEYS[4]) ~= leaseOwner then return -1 end
if group ~= '' and #rcall('XPENDING', KEYS[3], group, '-', '(' .. firstId, 1) > 0 then return -2 end

-- The entries: one XRANGE over the batch's span (a batch read from the group is contiguous but for
-- entries of other kinds); any id it does not cover (a claimed batch with gaps wider than the
-- span read) is read on its own.
local wanted, byId = {}, {}
for i = 1, n do wanted[ARGV[4 + i]] = true end
if n > 0 then
  for _, entry in ipairs(rcall('XRANGE', KEYS[3], ARGV[5], ARGV[4 + n], 'COUNT', n + 64)) do
    if wanted[entry[1]] then byId[entry[1]] = entry[2] end
  end
end

local appliedNow, appliedOrder = {}, {}
local logTail, tenants = {}, {}
-- most entries one millisecond of a tenant log holds (streams/read-models.ts MS_FINISH_BUDGET reads past it)
local LOG_ENTRIES_PER_MS = 1000
local timelines, timelineOrder, timelineTrim = {}, {}, {}
local catalog, catalogOrder = {}, {}
local counts, countOrder = {}, {}
local uniques, uniqueOrder = {}, {}
local samples, sampleOrder = {}, {}
local applied = 0

local function listFor(map, order, key)
  local list = map[key]
  if not list then
    list = {}
    map[key] = list
    order[#order + 1] = key
  end
  return list
end

-- volume: count `name` and `*` in bucket hash `vol`, and x as a member of both HyperLogLogs
local function countIn(vol, uv, name, x, untilMs, uvUntilMs)
  local bucket = counts[vol]
  if not bucket then
    bucket = { untilMs = untilMs, uv = uv, uvUntilMs = uvUntilMs, fields = {}, order = {} }
    counts[vol] = bucket
    countOrder[#countOrder + 1] = vol
  end
  for _, field in ipairs({ name, '*' }) do
    if not bucket.fields[field] then
      bucket.fields[field] = 0
      bucket.order[#bucket.order + 1] = field
    end
    bucket.fields[field] = bucket.fields[field] + 1
    if uvUntilMs > nowMs then
      local members = listFor(uniques, uniqueOrder, uv .. ':' .. field)
      members[#members + 1] = x
    end
  end
end

-- An inbox event as lua/includes/appendInboxEvent writes it (always the same fields in the same
-- order) is read by position into a table built whole; anything else (a timer entry) field by field.
-- (entries appended before `pv` or `tc` existed take the field-by-field path)
local LAYOUT = { 't', 'w', 'id', 'q', 'x', 'u', 'n', 'o', 'ts', 'r', 'd', 'c', 'ru', 'm', 'st', 'pv', 'tc' }
local function fieldsOf(list)
  local usual = #list == 2 * #LAYOUT
  if usual then
    for j, name in ipairs(LAYOUT) do
      if list[2 * j - 1] ~= name then
        usual = false
        break
      end
    end
  end
  if usual then
    return { t = list[2], id = list[6], q = list[8], x = list[10], u = list[12], n = list[14], o = list[16],
      ts = list[18], r = list[20], d = list[22], c = list[24], ru = list[26], m = list[28], st = list[30], pv = list[32], tc = list[34] }
  end
  local f = {}
  for j = 1, #list, 2 do f[list[j]] = list[j + 1] end
  return f
end

-- pass 1: the entries' fields, and the distinct subscribers' last applied sequences in one HMGET;
-- each tenant's highest ordinal processed (`tc`, see lua/ingestEvents), applied or skipped alike
local records, fieldsWanted, seenField = {}, {}, {}
local processed, processedOrder = {}, {}
for i = 1, n do
  local list = byId[ARGV[4 + i]]
  if not list then
    local entry = rcall('XRANGE', KEYS[3], ARGV[4 + i], ARGV[4 + i])[1]
    list = entry and entry[2]
  end
  local f = list and fieldsOf(list) or {}
  local q = tonumber(f.q or '')
  if f.t and f.x and q and f.k ~= 'timer' then
    local tc = tonumber(f.tc or '')
    if tc then
      local top = processed[f.t]
      if not top then processedOrder[#processedOrder + 1] = f.t end
      if not top or tc > top then processed[f.t] = tc end
    end
    f.field, f.seq, f.inboxId = f.t .. '|' .. f.x, q, ARGV[4 + i]
    records[#records + 1] = f
    if not seenField[f.field] then
      seenField[f.field] = true
      fieldsWanted[#fieldsWanted + 1] = f.field
    end
  end
end
if #records == 0 then return 0 end
-- the tenants' backlog here goes down (never back: a batch read again after a crash holds lower ordinals)
if #processedOrder > 0 then
  local backlogKey = base .. ':backlog'
  local doneFields = {}
  for k, t in ipairs(processedOrder) do doneFields[k] = 'd|' .. t end
  local done = rcall('HMGET', backlogKey, unpack(doneFields))
  local sets = {}
  for k, t in ipairs(processedOrder) do
    if processed[t] > tonumber(done[k] or '0') then
      sets[#sets + 1] = doneFields[k]
      sets[#sets + 1] = processed[t]
    end
  end
  if #sets > 0 then rcall('HSET', backlogKey, unpack(sets)) end
end
local lastApplied = {}
local found = rcall('HMGET', KEYS[1], unpack(fieldsWanted))
for i, field in ipairs(fieldsWanted) do lastApplied[field] = tonumber(found[i] or '0') end

for _, f in ipairs(records) do
  local t, x, q, field = f.t, f.x, f.seq, f.field
  local last = lastApplied[field]
  if last and q > last then
    applied = applied + 1
    lastApplied[field] = q
    if not appliedNow[field] then appliedOrder[#appliedOrder + 1] = field end
    appliedNow[field] = f.q
    tenants[t] = true
    local id, u, name, o, ts, r, d, ru, m, st, pv =
      f.id or '', f.u or '', f.n or '', f.o or '', tonumber(f.ts or ''), f.r or '', f.d or '', f.ru or '', f.m or '', f.st or '', f.pv or ''
    -- tenant log (the one durable copy of the event); log ids carry receivedAt, so the tenant log
    -- merged across partitions reads newest-received first; never below the stream's last id (web
    -- processes' clocks may differ slightly)
    local logKey = base .. ':log:' .. t
    if not logTail[logKey] then
      local top = rcall('XREVRANGE', logKey, '+', '-', 'COUNT', 1)[1]
      local topMs, topSeq = 0, 0
      if top then
        local a, b = string.match(top[1], '^(%d+)-(%d+)$')
        topMs, topSeq = tonumber(a), tonumber(b)
      end
      logTail[logKey] = { topMs, topSeq }
    end
    local receivedMs = tonumber(r)
    local tail = logTail[logKey]
    local ms = math.max(receivedMs, tail[1])
    -- at most LOG_ENTRIES_PER_MS entries a millisecond: the next goes to the next millisecond. A log
    -- read finishes each millisecond it stops in (streams/read-models.ts), which stays bounded only so:
    -- a write stamped ahead (another web process's clock) piled every later entry of the partition
    -- onto its millisecond until the clocks met, and a list then left out events (probe DP: 2,602 in
    -- one millisecond, two never listed)
    if ms == tail[1] and tail[2] + 1 >= LOG_ENTRIES_PER_MS then ms = ms + 1 end
    local logId = rcall('XADD', logKey, 'MINID', '~', trimBelow, (ms == receivedMs and r or decimal(ms)) .. '-*',
      'id', id, 'q', f.q, 'x', x, 'u', u, 'n', name, 'o', o, 'ts', f.ts, 'r', r, 'd', d, 'ru', ru, 'm', m, 'st', st, 'pv', pv)
    local idMs, idSeq = string.match(logId, '^(%d+)-(%d+)$')
    logTail[logKey] = { tonumber(idMs), tonumber(idSeq) }
    -- an event sent with the caller's id: its dedupe entry pointed at the inbox entry, which goes once
    -- acked; it points at the tenant-log entry from now on (unless it was forgotten or reused meanwhile)
    if f.c and f.c ~= '' then
      local dedupe = dedupeField(t, x, f.c, f.o)
      local pointer = rcall('HGET', dedupeKey, dedupe)
      -- an entry ingested before dedupeField has the old form of the field (see lua/ingestEvents)
      if not pointer then dedupe = field .. '|' .. f.c; pointer = rcall('HGET', dedupeKey, dedupe) end
      if pointer == 'i' .. f.inboxId then rcall('HSET', dedupeKey, dedupe, 'l' .. logId) end
    end
    -- the subscriber's timeline
    local timeline = listFor(timelines, timelineOrder, base .. ':tl:' .. t .. ':' .. x)
    timeline[#timeline + 1] = f.q
    timeline[#timeline + 1] = logId
    if q % TRIM_EVERY == 0 then timelineTrim[#timelineTrim + 1] = base .. ':tl:' .. t .. ':' .. x end
    -- catalog (all-time count, first and last seen, sources and providers)
    local catKey = base .. ':cat:' .. t
    local byName = catalog[catKey]
    if not byName then
      byName = { names = {}, order = {} }
      catalog[catKey] = byName
      catalogOrder[#catalogOrder + 1] = catKey
    end
    local entry = byName.names[name]
    if not entry then
      entry = { count = 0, first = ts, last = ts, sources = {}, providers = {} }
      byName.names[name] = entry
      byName.order[#byName.order + 1] = name
    end
    entry.count = entry.count + 1
    if ts < entry.first then entry.first = ts end
    if ts > entry.last then entry.last = ts end
    entry.sources[o] = true
    if pv ~= '' then entry.providers[pv] = true end
    -- volume and distinct subscribers per hour and per day of the event's timestamp
    -- hourly counts stay 32 days (the catalog's 7- and 30-day windows read their oldest day by
    -- the hour), hourly distinct subscribers 48 hours (the 24-hour volume)
    local hour, day = ts - (ts % HOUR), ts - (ts % DAY)
    if hour + HOUR_COUNTS_KEPT > nowMs then
      local h = decimal(hour)
      countIn(base .. ':vol:' .. t .. ':h:' .. h, base .. ':uv:' .. t .. ':h:' .. h, name, x, hour + HOUR_COUNTS_KEPT, hour + 48 * HOUR)
    end
    -- daily buckets outlive a retention shorter than the 30-day window it counts (probe Y: with
    -- EVENT_RETENTION_DAYS 1 an event 5 days back was in no 7-day or 30-day count)
    local dayKeep = day + math.max(retention, 30 * DAY) + 2 * DAY
    if dayKeep > nowMs then
      local dd = decimal(day)
      countIn(base .. ':vol:' .. t .. ':d:' .. dd, base .. ':uv:' .. t .. ':d:' .. dd, name, x, dayKeep, dayKeep)
    end
    -- newest samples of the name
    local smp = listFor(samples, sampleOrder, base .. ':smp:' .. t .. ':' .. name)
    smp[#smp + 1] = logId
  end
end

if applied == 0 then return 0 end

-- timelines: the new entries; every TRIM_EVERY events, the oldest ones out of the retention window
local keep = nowMs + retention
for _, key in ipairs(timelineOrder) do
  rcall('ZADD', key, unpack(timelines[key]))
  rcall('PEXPIREAT', key, keep)
end
for _, key in ipairs(timelineTrim) do
  for _, member in ipairs(rcall('ZRANGE', key, 0, TRIM_MOST - 1)) do
    local at = tonumber(string.match(member, '^(%d+)'))
    if at and at < nowMs - retention then rcall('ZREM', key, member) else break end
  end
end
for _, catKey in ipairs(catalogOrder) do
  local byName = catalog[catKey]
  local sets = {}
  for _, name in ipairs(byName.order) do
    local entry = byName.names[name]
    rcall('HINCRBY', catKey, name .. '|all', entry.count)
    local seen = rcall('HMGET', catKey, name .. '|first', name .. '|last')
    local first, last = tonumber(seen[1] or '0'), tonumber(seen[2] or '0')
    if first == 0 or entry.first < first then
      sets[#sets + 1] = name .. '|first'
      sets[#sets + 1] = entry.first
    end
    if entry.last > last then
      sets[#sets + 1] = name .. '|last'
      sets[#sets + 1] = entry.last
    end
    for o in pairs(entry.sources) do
      sets[#sets + 1] = name .. '|src:' .. o
      sets[#sets + 1] = 1
    end
    for pv in pairs(entry.providers) do
      sets[#sets + 1] = name .. '|prv:' .. pv
      sets[#sets + 1] = 1
    end
  end
  rcall('HSET', catKey, unpack(sets))
end
-- a bucket is new when its count equals what this call added: then it and its HyperLogLogs get
-- their fixed expiry (the HyperLogLog of a field is created with the field's first count)
local fresh = {}
for _, vol in ipairs(countOrder) do
  local bucket = counts[vol]
  for _, field in ipairs(bucket.order) do
    local added = bucket.fields[field]
    if rcall('HINCRBY', vol, field, added) == added then
      if field == '*' then rcall('PEXPIREAT', vol, bucket.untilMs) end
      fresh[bucket.uv .. ':' .. field] = bucket.uvUntilMs
    end
  end
end
for _, key in ipairs(uniqueOrder) do
  rcall('PFADD', key, unpack(uniques[key]))
  if fresh[key] then rcall('PEXPIREAT', key, fresh[key]) end
end
for _, key in ipairs(sampleOrder) do
  local ids = samples[key]
  -- newest first: LPUSH puts the last argument at the head
  rcall('LPUSH', key, unpack(ids))
  rcall('LTRIM', key, 0, SAMPLES - 1)
  -- once the retention has passed since its last write, every entry it names is trimmed from the log
  rcall('PEXPIREAT', key, keep)
end
local fields = {}
for _, field in ipairs(appliedOrder) do
  fields[#fields + 1] = field
  fields[#fields + 1] = appliedNow[field]
end
rcall('HSET', KEYS[1], unpack(fields))
for t in pairs(tenants) do
  rcall('ZADD', KEYS[2], nowMs, t)
end
return applied
