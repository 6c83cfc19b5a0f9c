--[[
  Appends a batch of one tenant's events that all fall in one partition, atomically:
  dedupe on the caller's id per subscriber, the subscriber's sequence, the first sighting of an
  externalId (which writes `$subscriber.created` first), and the append to the partition inbox.

  KEYS[1] partition inbox stream        ({pN}:in)
  KEYS[2] sequence hash                 ({pN}:seq)        field tenant|externalId -> last sequence
  KEYS[3] subscriber hash               ({pN}:subs)       field tenant|externalId -> sub_ id
  KEYS[4] dedupe hash                   ({pN}:dedupe)     field tenant|externalId|callerId -> original event
  KEYS[5] dedupe age zset               ({pN}:dedupe-age) member = dedupe field, score = receivedAt ms

  ARGV[1] tenant id
  ARGV[2] workspace id
  ARGV[3] receivedAt (ms)
  ARGV[4] largest inbox backlog accepted (entries); above it nothing is stored
  ARGV[5] partition key base ({pN} with the key prefix): the subscriber record and index are built from it
  ARGV[6] receivedAt (ISO 8601)
  ARGV[7] number of events N
  then N groups of 12: evt id, evt id for a $subscriber.created, sub_ id if new, externalId, name,
       source, timestamp (ms), data (JSON text), caller id ('' for none), runId, messageId, step

  Returns { -1 } when the inbox backlog is over the limit (nothing stored), else one item per event:
    { 1, sequence, subscriberId, createdSequence }  accepted (createdSequence 0 unless this call created the subscriber)
    { 2, originalEvent }                            duplicate: the original as JSON meta, a newline, then its data
]]
-- @include "ensureSubscriber"
local rcall = redis.call
local tenant, workspace, received = ARGV[1], ARGV[2], ARGV[3]
if rcall('XLEN', KEYS[1]) > tonumber(ARGV[4]) then return { -1 } end
local part = { inbox = KEYS[1], seq = KEYS[2], subs = KEYS[3], base = ARGV[5], tenant = tenant, workspace = workspace, received = received, receivedIso = ARGV[6] }

local out = {}
local n = tonumber(ARGV[7])
for i = 0, n - 1 do
  local b = 8 + i * 12
  local id, createdId, newSub, externalId, name, source, ts, data, callerId, runId, messageId, step =
    ARGV[b], ARGV[b + 1], ARGV[b + 2], ARGV[b + 3], ARGV[b + 4], ARGV[b + 5], ARGV[b + 6], ARGV[b + 7], ARGV[b + 8], ARGV[b + 9], ARGV[b + 10], ARGV[b + 11]
  local field = tenant .. '|' .. externalId
  local dedupeField = callerId ~= '' and (field .. '|' .. callerId) or nil
  local original = dedupeField and rcall('HGET', KEYS[4], dedupeField)
  if original then
    out[#out + 1] = { 2, original }
  else
    local sub, createdSeq = ensureSubscriber(part, externalId, newSub, createdId)
    local seq = rcall('HINCRBY', KEYS[2], field, 1)
    appendInboxEvent(KEYS[1], { t = tenant, w = workspace, id = id, q = seq, x = externalId, u = sub, n = name, o = source,
      ts = ts, r = received, d = data, c = callerId, ru = runId, m = messageId, st = step })
    if dedupeField then
      local meta = cjson.encode({ id = id, q = seq, ts = ts, r = received, o = source, n = name, ru = runId, m = messageId, st = step })
      rcall('HSET', KEYS[4], dedupeField, meta .. '\n' .. data)
      rcall('ZADD', KEYS[5], received, dedupeField)
    end
    out[#out + 1] = { 1, seq, sub, createdSeq }
  end
end
return out
