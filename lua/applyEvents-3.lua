--[[
  The subscriber actor's step for a batch of partition-inbox entries: for each event not yet
  applied (its sequence above the subscriber's last applied one), update every read model of the
  partition, then record the sequence, all in one atomic call, so a redelivered entry is skipped
  and no effect happens twice.

  KEYS[1] applied hash        ({pN}:applied)  field tenant|externalId -> last applied sequence
  KEYS[2] partition tenants   ({pN}:tenants)  zset of tenant ids with data here, score = last write ms
  KEYS[3] partition inbox     ({pN}:in)       the entries, read here by id (the caller sends ids, not
                                              the events again: half the bytes of a batch)

  ARGV[1] partition key base ({pN} with the key prefix); read-model keys are built from it with the
          suffixes of streams/keys.ts (tenantLog, timeline, catalog, volume, uniques, samples)
  ARGV[2] retention (ms)
  ARGV[3] now (ms)
  ARGV[4] number of entries N
  then N inbox entry ids, in stream order; an entry gone from the inbox, or a timer entry, is skipped
  (inbox fields used: t, x, id, q, u, n, o, ts, r, d, c, ru, m, st)

  Returns the number of entries applied (the rest were already applied).
]]
local rcall = redis.call
local base, retention, nowMs = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local HOUR, DAY = 3600000, 86400000
local SAMPLES = 20
local expiries, samples, tenants, logTail = {}, {}, {}, {}
local applied = 0

local function touch(key, untilMs)
  local current = expiries[key]
  if not current or current < untilMs then expiries[key] = untilMs end
end

local n = tonumber(ARGV[4])
for i = 1, n do
  local entry = rcall('XRANGE', KEYS[3], ARGV[4 + i], ARGV[4 + i])[1]
  local f = {}
  if entry then
    local list = entry[2]
    for j = 1, #list, 2 do f[list[j]] = list[j + 1] end
  end
  local t, x, id, q, u, name, o, ts, r, d, c, ru, m, st =
    f.t, f.x, f.id or '', tonumber(f.q or ''), f.u or '', f.n or '', f.o or '',
    tonumber(f.ts or ''), f.r or '', f.d or '', f.c or '', f.ru or '', f.m or '', f.st or ''
  local field = t and x and (t .. '|' .. x)
  local last = field and q and f.k ~= 'timer' and tonumber(rcall('HGET', KEYS[1], field) or '0')
  if last and q > last then
    applied = applied + 1
    tenants[t] = true
    -- tenant log (the one durable copy of the event) and the subscriber's timeline
    -- log ids carry receivedAt, so the tenant log merged across partitions reads newest-received first;
    -- never below the stream's last id (web processes' clocks may differ slightly)
    local logKey = base .. ':log:' .. t
    if not logTail[logKey] then
      local last = rcall('XREVRANGE', logKey, '+', '-', 'COUNT', 1)[1]
      logTail[logKey] = last and tonumber(string.match(last[1], '^(%d+)')) or 0
    end
    local ms = math.max(tonumber(r), logTail[logKey])
    local logId = rcall('XADD', logKey, 'MINID', '~', tostring(nowMs - retention), ms .. '-*',
      'id', id, 'q', q, 'x', x, 'u', u, 'n', name, 'o', o, 'ts', ts, 'r', r, 'd', d, 'ru', ru, 'm', m, 'st', st)
    logTail[logKey] = ms
    local tlKey = base .. ':tl:' .. t .. ':' .. x
    rcall('ZADD', tlKey, q, logId)
    touch(tlKey, nowMs + retention)
    -- drop the oldest timeline entries that fell out of the retention window (a few per write)
    local oldest = rcall('ZRANGE', tlKey, 0, 4)
    for _, member in ipairs(oldest) do
      local at = tonumber(string.match(member, '^(%d+)'))
      if at and at < nowMs - retention then rcall('ZREM', tlKey, member) else break end
    end
    -- catalog (all-time count, first and last seen, sources)
    local catKey = base .. ':cat:' .. t
    rcall('HINCRBY', catKey, name .. '|all', 1)
    local first = tonumber(rcall('HGET', catKey, name .. '|first') or '0')
    if first == 0 or ts < first then rcall('HSET', catKey, name .. '|first', ts) end
    local lastSeen = tonumber(rcall('HGET', catKey, name .. '|last') or '0')
    if ts > lastSeen then rcall('HSET', catKey, name .. '|last', ts) end
    rcall('HSET', catKey, name .. '|src:' .. o, 1)
    -- volume and distinct subscribers per hour and per day of the event's timestamp
    local hour, day = ts - (ts % HOUR), ts - (ts % DAY)
    if hour + 48 * HOUR > nowMs then
      local vh = base .. ':vol:' .. t .. ':h:' .. hour
      rcall('HINCRBY', vh, name, 1)
      rcall('HINCRBY', vh, '*', 1)
      touch(vh, hour + 48 * HOUR)
      local uh, uhAll = base .. ':uv:' .. t .. ':h:' .. hour .. ':' .. name, base .. ':uv:' .. t .. ':h:' .. hour .. ':*'
      rcall('PFADD', uh, x)
      rcall('PFADD', uhAll, x)
      touch(uh, hour + 48 * HOUR)
      touch(uhAll, hour + 48 * HOUR)
    end
    local dayKeep = day + retention + 2 * DAY
    if dayKeep > nowMs then
      local vd = base .. ':vol:' .. t .. ':d:' .. day
      rcall('HINCRBY', vd, name, 1)
      rcall('HINCRBY', vd, '*', 1)
      touch(vd, dayKeep)
      local ud, udAll = base .. ':uv:' .. t .. ':d:' .. day .. ':' .. name, base .. ':uv:' .. t .. ':d:' .. day .. ':*'
      rcall('PFADD', ud, x)
      rcall('PFADD', udAll, x)
      touch(ud, dayKeep)
      touch(udAll, dayKeep)
    end
    -- newest samples of the name
    local smpKey = base .. ':smp:' .. t .. ':' .. name
    samples[smpKey] = samples[smpKey] or {}
    table.insert(samples[smpKey], logId)
    rcall('HSET', KEYS[1], field, q)
  end
end

for key, ids in pairs(samples) do
  rcall('LPUSH', key, unpack(ids))
  rcall('LTRIM', key, 0, SAMPLES - 1)
end
for key, untilMs in pairs(expiries) do
  rcall('PEXPIREAT', key, untilMs)
end
for t in pairs(tenants) do
  rcall('ZADD', KEYS[2], nowMs, t)
end
return applied
