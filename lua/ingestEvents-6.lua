--[[
  Appends a batch of one tenant's events that all fall in one partition, atomically:
  dedupe on the caller's id per subscriber, the subscriber's sequence, the first sighting of an
  externalId (which writes `$subscriber.created` first), and the append to the partition inbox.

  KEYS[1] partition inbox stream        ({pN}:in)
  KEYS[2] sequence hash                 ({pN}:seq)        field tenant|externalId -> last sequence
  KEYS[3] subscriber hash               ({pN}:subs)       field tenant|externalId -> sub_ id
  KEYS[4] dedupe hash                   ({pN}:dedupe)     field includes/dedupeField -> where the original is:
                                                          'i' .. inbox entry id until the worker applies it, then
                                                          'l' .. tenant-log entry id (lua/applyEvents rewrites it);
                                                          a pointer, not a copy: the event is stored once
  KEYS[5] dedupe age zset               ({pN}:dedupe-age) member = dedupe field, score = receivedAt ms
  KEYS[6] tenant backlog hash           ({pN}:backlog)    field i|tenant -> ordinal of the tenant's last event appended
                                                          here (stamped on the entry as `tc`); d|tenant -> the highest
                                                          ordinal the worker processed (lua/applyEvents)

  ARGV[1] tenant id
  ARGV[2] workspace id
  ARGV[3] receivedAt (ms)
  ARGV[4] largest inbox backlog accepted (entries); above it nothing is stored
  ARGV[5] partition key base ({pN} with the key prefix): the subscriber record and index are built from it
  ARGV[6] receivedAt (ISO 8601)
  ARGV[7] number of events N
  ARGV[8] subscriber report threshold: a subscriber of the call with at least this many events not yet
          processed (its last sequence minus its last applied one) is named in the last item; 0 for none
  then N groups of 13: evt id, evt id for a $subscriber.created, sub_ id (a caller's event: the id of
       the subscriber it creates if it is new; an engine event, source `system`: the id of the
       subscriber the engine read, '' for whichever exists), externalId, name,
       source, timestamp (ms), data (JSON text), caller id ('' for none), runId, messageId, step,
       provider ('' for none: only a Source's events, source webhook, have one)

  Returns { -1, length } when the inbox backlog is over the limit (nothing stored), else one item per
  event, then one more:
    { 1, sequence, subscriberId, createdSequence }  accepted (createdSequence 0 unless this call created the subscriber)
    { 2, originalEvent }                            duplicate: the original as JSON meta, a newline, then its data
    { 4 }                                           not stored: an engine event (source `system`) of an externalId
                                                    that is no subscriber, or another one than the engine read
                                                    (deleted since, and perhaps created again)
    { 3, length, pending, x, n, ... }               last: the inbox's length after the append, the tenant's
                                                    events not yet processed here (i - d, at most the length), and
                                                    each subscriber of the call at the report threshold with its
                                                    own: the caller keeps them to check a partition, a tenant or a
                                                    subscriber near its limit before its next write (streams/ingest.ts)
  A dedupe entry whose original is gone (its tenant-log entry trimmed out of the retention before the
  sweeper forgot the entry) has expired: the event is accepted as new and the entry points at it. So
  has one whose original belongs to a deleted subscriber (spec 2.4: the id is unique per subscriber;
  a subscriber created again under the same externalId is another one): the event is accepted, and
  creates the subscriber.
]]
-- @include "ensureSubscriber"
-- @include "dedupeField"
local rcall = redis.call
local tenant, workspace, received = ARGV[1], ARGV[2], ARGV[3]
local backlog = rcall('XLEN', KEYS[1])
if backlog > tonumber(ARGV[4]) then return { -1, backlog } end
local part = { inbox = KEYS[1], seq = KEYS[2], subs = KEYS[3], base = ARGV[5], tenant = tenant, workspace = workspace, received = received, receivedIso = ARGV[6] }

-- The original event a dedupe entry points at, as meta JSON, a newline and its data, or nil when it is gone,
-- when it is not the subscriber `sub`'s (a deleted one's of the same externalId), or, with `owner`, when it
-- is not that externalId's. Entries written before pointers held the original itself (meta JSON first).
local function original(pointer, sub, owner)
  local kind, id = string.sub(pointer, 1, 1), string.sub(pointer, 2)
  if kind == '{' then return pointer end
  local stream = kind == 'i' and KEYS[1] or (kind == 'l' and (ARGV[5] .. ':log:' .. tenant)) or nil
  local entry = stream and rcall('XRANGE', stream, id, id)[1]
  if not entry then return nil end
  local f = {}
  for j = 1, #entry[2], 2 do f[entry[2][j]] = entry[2][j + 1] end
  if owner and f.x ~= owner then return nil end
  if f.u and f.u ~= sub then return nil end
  return cjson.encode({ id = f.id, q = tonumber(f.q), ts = f.ts, r = f.r, o = f.o, n = f.n, ru = f.ru or '', m = f.m or '', st = f.st or '', pv = f.pv or '' })
    .. '\n' .. (f.d or '{}')
end

-- Whether `sub` (the subscriber of the externalId now, nil for none) is the one an engine event was
-- about: `read`, the id the engine read ('' for whichever exists).
local function isSubscriber(sub, read)
  return sub and (read == '' or sub == read)
end

local out = {}
local n = tonumber(ARGV[7])
local ordinalField, doneField = 'i|' .. tenant, 'd|' .. tenant
local ordinal = tonumber(rcall('HGET', KEYS[6], ordinalField) or '0')
local firstOrdinal = ordinal
-- the last sequence of each subscriber that got an event here, for the report
local lastSeq, seqOrder = {}, {}
for i = 0, n - 1 do
  local b = 9 + i * 13
  local id, createdId, newSub, externalId, name, source, ts, data, callerId, runId, messageId, step, provider =
    ARGV[b], ARGV[b + 1], ARGV[b + 2], ARGV[b + 3], ARGV[b + 4], ARGV[b + 5], ARGV[b + 6], ARGV[b + 7], ARGV[b + 8], ARGV[b + 9], ARGV[b + 10], ARGV[b + 11], ARGV[b + 12]
  local field = tenant .. '|' .. externalId
  -- no subscriber (never seen, or deleted): no entry can be its duplicate
  local current = callerId ~= '' and rcall('HGET', KEYS[3], field)
  local dedupe = current and dedupeField(tenant, externalId, callerId, source) or nil
  local pointer = dedupe and rcall('HGET', KEYS[4], dedupe)
  local found = pointer and original(pointer, current)
  if dedupe and not pointer and source ~= 'system' and source ~= 'webhook' then
    -- an entry of the field's form before dedupeField (tenant|externalId|callerId, ambiguous when the ids
    -- hold `|`), until the retention forgets those: it counts only when its original is this subscriber's
    local legacy = rcall('HGET', KEYS[4], field .. '|' .. callerId)
    found = legacy and original(legacy, current, externalId)
  end
  if found then
    out[#out + 1] = { 2, found }
  elseif source == 'system' and not isSubscriber(current or rcall('HGET', KEYS[3], field), newSub) then
    -- the engine's own events are about a subscriber it read a moment ago (a fan-out's `$send`): one
    -- deleted since is not made again by them, with a `$subscriber.created` and a record nobody asked
    -- for, listed and never retained away (probe EG: 9 deleted subscribers back in 4 runs under load);
    -- nor is one created again under its externalId given them: the push was the deleted one's, to
    -- its devices (probe EN: it reached the deleted user's phone, now another app user's)
    out[#out + 1] = { 4 }
  else
    local sub, createdSeq = ensureSubscriber(part, externalId, newSub, createdId)
    local seq = rcall('HINCRBY', KEYS[2], field, 1)
    if not lastSeq[externalId] then seqOrder[#seqOrder + 1] = externalId end
    lastSeq[externalId] = seq
    ordinal = ordinal + 1
    local inboxId = appendInboxEvent(KEYS[1], { t = tenant, w = workspace, id = id, q = seq, x = externalId, u = sub, n = name, o = source,
      ts = ts, r = received, d = data, c = callerId, ru = runId, m = messageId, st = step, pv = provider, tc = ordinal })
    if callerId ~= '' then
      dedupe = dedupe or dedupeField(tenant, externalId, callerId, source)
      rcall('HSET', KEYS[4], dedupe, 'i' .. inboxId)
      rcall('ZADD', KEYS[5], received, dedupe)
    end
    out[#out + 1] = { 1, seq, sub, createdSeq }
  end
end
if ordinal > firstOrdinal then rcall('HSET', KEYS[6], ordinalField, ordinal) end
local length = rcall('XLEN', KEYS[1])
-- every unprocessed entry is still in the inbox (entries are trimmed once acked): the length bounds
-- the count, should the hash ever disagree with the stream
local pending = math.min(length, math.max(0, ordinal - tonumber(rcall('HGET', KEYS[6], doneField) or '0')))
local last = { 3, length, pending }
local threshold = tonumber(ARGV[8])
if threshold > 0 and #seqOrder > 0 then
  local fields = {}
  for k, x in ipairs(seqOrder) do fields[k] = tenant .. '|' .. x end
  local applied = rcall('HMGET', ARGV[5] .. ':applied', unpack(fields))
  for k, x in ipairs(seqOrder) do
    local waiting = lastSeq[x] - tonumber(applied[k] or '0')
    if waiting >= threshold then
      last[#last + 1] = x
      last[#last + 1] = waiting
    end
  end
end
out[#out + 1] = last
return out
