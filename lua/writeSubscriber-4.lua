--[[
  The one write path for a subscriber's own state in its partition, after the caller has read it
  and computed the change: ensures the subscriber (optionally creating it), checks the record's
  version (compare-and-set, so concurrent writers of one subscriber never both apply a change
  computed from the same state) and the change's guards, appends the change's engine events to the
  inbox with the next sequences, then applies the record operations, all atomically.

  KEYS[1] partition inbox ({pN}:in)
  KEYS[2] sequence hash   ({pN}:seq)
  KEYS[3] subscriber hash ({pN}:subs)
  KEYS[4] the partition's audit outbox ({pN}:outbox, lua/includes/recordAudit)

  ARGV[1] tenant id          ARGV[2] workspace id       ARGV[3] now (ms)     ARGV[4] partition key base
  ARGV[5] now (ISO 8601)     ARGV[6] externalId         ARGV[7] sub_ id if created
  ARGV[8] evt_ id for $subscriber.created               ARGV[9] 1 to create an unknown subscriber, 0 to refuse
  ARGV[10] expected record version and subscriber id, `<version>|<sub_ id or empty when absent>` ('' to skip the check):
           the version alone starts again when a subscriber is deleted and created anew, so a change
           computed from the old one would apply to the new one (probe W)
  ARGV[11] audit intent token ('' for a write without audit), ARGV[12] audit intent (recorded when applied)
  ARGV[13] token of an intent of the same request this write absorbs ('' for none: streams/subscriber-audit.ts),
           deleted from the outbox when the write applies
  ARGV[14] 1 when the caller (or the audit's operation) needs the record after the write in the reply, else 0
  ARGV[15] number of events E, then E groups of 3: evt id, name, data (JSON)
  then the number of operations O, then O groups of 4: op, key, a, b
       (op: hset key field value | hdel key field - | del key - - | sadd key member - | srem key member -
            | zadd key score member | zrem key member - | hmset key n - followed by n field/value pairs);
       every key is in this partition; a zadd or zrem member starting `$SUB|` gets the subscriber id in
       place of `$SUB` (nothing else is rewritten)
  then the number of guards G (may be absent: none), then G groups of 4: kind, key, a, b
       (absent key - - : the key must not exist | scardBelow key n - : the set must hold fewer than n members
        | fieldIs key field value : the hash field holds value, '' meaning absent or empty),
       checked after the version, before anything is written
  then the largest partition inbox length the write is made at ('' or absent: no bound): above it,
       nothing is written (the API's writes pass INBOX_MAX_BACKLOG, as ingest; the engine's pass none)

  Returns { 1, subscriberId, createdSequence, newVersion, record } when applied (record as below; with an audit intent:
          { 1, subscriberId, createdSequence, newVersion, record, absorbed }, record the subscriber's
          record after the write as HGETALL's flat list (empty unless ARGV[14] is 1), absorbed 1 when the intent of ARGV[13] was
          still there, else 0; this reply is what the outbox records),
          { 0, currentVersion } on a version mismatch (nothing written), { -2 } when the subscriber is unknown and ARGV[9] is 0,
          { -3, g } when guard g (1-based) does not hold (nothing written),
          { -4, length } when the inbox holds more entries than the bound (nothing written).
]]
-- @include "ensureSubscriber"
-- @include "applyOp"
-- @include "recordAudit"
local rcall = redis.call
local tenant, externalId = ARGV[1], ARGV[6]
local part = { inbox = KEYS[1], seq = KEYS[2], subs = KEYS[3], base = ARGV[4], tenant = tenant, workspace = ARGV[2], received = ARGV[3], receivedIso = ARGV[5] }
local field = tenant .. '|' .. externalId
local record = ARGV[4] .. ':sub:' .. tenant .. ':' .. externalId

if ARGV[9] ~= '1' and not rcall('HEXISTS', KEYS[3], field) then return { -2 } end
local version = tonumber(rcall('HGET', record, 'v') or '0')
if ARGV[10] ~= '' then
  local bar = string.find(ARGV[10], '|', 1, true)
  local expectedVersion = tonumber(bar and string.sub(ARGV[10], 1, bar - 1) or ARGV[10])
  if expectedVersion ~= version or (bar and (rcall('HGET', record, 'id') or '') ~= string.sub(ARGV[10], bar + 1)) then return { 0, version } end
end

-- where the operations start, then the guards (after the events and the operations)
local events = tonumber(ARGV[15])
local opsAt = 16 + 3 * events
local ops = tonumber(ARGV[opsAt])
local g = opsAt + 1
for _ = 1, ops do
  if ARGV[g] == 'hmset' then g = g + 4 + 2 * tonumber(ARGV[g + 2]) else g = g + 4 end
end
local guards = tonumber(ARGV[g] or '0')
for n = 1, guards do
  local kind, key, a, b = ARGV[g + 1], ARGV[g + 2], ARGV[g + 3], ARGV[g + 4]
  if kind == 'absent' then
    if rcall('EXISTS', key) == 1 then return { -3, n } end
  elseif kind == 'scardBelow' then
    if rcall('SCARD', key) >= tonumber(a) then return { -3, n } end
  elseif kind == 'fieldIs' then
    if (rcall('HGET', key, a) or '') ~= b then return { -3, n } end
  else
    return redis.error_reply('unknown write guard ' .. tostring(kind))
  end
  g = g + 4
end
local maxBacklog = tonumber(ARGV[g + 1] or '')
if maxBacklog then
  local length = rcall('XLEN', KEYS[1])
  if length > maxBacklog then return { -4, length } end
end

local sub, createdSeq = ensureSubscriber(part, externalId, ARGV[7], ARGV[8])

local i = 16
for _ = 1, events do
  local seq = rcall('HINCRBY', KEYS[2], field, 1)
  appendInboxEvent(KEYS[1], { t = tenant, w = ARGV[2], id = ARGV[i], q = seq, x = externalId, u = sub, n = ARGV[i + 1], o = 'system',
    ts = ARGV[3], r = ARGV[3], d = ARGV[i + 2] })
  i = i + 3
end

-- only the leading `$SUB|` of a zadd or zrem member is replaced: the same text anywhere else (an
-- attribute, a property, an externalId holding `$SUB`) is the caller's and is stored as sent
local function withSubscriberId(member)
  if string.sub(member, 1, 5) == '$SUB|' then return sub .. string.sub(member, 5) end
  return member
end

i = opsAt + 1
for _ = 1, ops do
  -- a sorted-set member `$SUB|<externalId>` (the partition's subscriber indexes) stands for
  -- `<subscriber id>|<externalId>`: the id is unknown to the caller when this call creates it
  local op, key = ARGV[i], ARGV[i + 1]
  if op == 'hmset' then
    local n = tonumber(ARGV[i + 2])
    local fv = {}
    for j = 1, 2 * n do fv[j] = ARGV[i + 3 + j] end
    rcall('HSET', key, unpack(fv))
    i = i + 4 + 2 * n
  else
    local a, b = ARGV[i + 2], ARGV[i + 3]
    if op == 'zadd' then b = withSubscriberId(b) elseif op == 'zrem' then a = withSubscriberId(a) end
    local failed = applyOp(op, key, a, b)
    if failed then return failed end
    i = i + 4
  end
end

-- creating the subscriber is a change too: a concurrent writer that read it absent recomputes
-- (else each of two parallel creates without attributes would report the creation)
local newVersion = version
if events > 0 or ops > 0 or createdSeq > 0 then
  if rcall('EXISTS', record) == 1 then newVersion = rcall('HINCRBY', record, 'v', 1) end
end
if ARGV[11] == '' then return { 1, sub, createdSeq, newVersion, ARGV[14] == '1' and rcall('HGETALL', record) or {} } end
local absorbed = 0
if ARGV[13] ~= '' then absorbed = rcall('HDEL', KEYS[4], ARGV[13]) end
local reply = { 1, sub, createdSeq, newVersion, ARGV[14] == '1' and rcall('HGETALL', record) or {}, absorbed }
recordAudit(KEYS[4], ARGV[11], ARGV[12], reply)
return reply
