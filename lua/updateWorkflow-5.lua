--[[
  Changes a workflow if it exists and its current version is still the one the caller computed
  from (compare-and-set): fields of its record and, when the definition changed, a new immutable
  version n+1 that becomes current. `updatedAt` moves, and the automation version is bumped, only
  when something actually changes. Before and after are read in the same step for the audit entry,
  recorded in the outbox with the change.

  KEYS[1] the workflow's record             (hash)
  KEYS[2] the workflow's versions           (zset version number -> version id)
  KEYS[3] the new version's record          (hash; untouched when ARGV[3] is '')
  KEYS[4] the tenant's automation version   (string counter)
  KEYS[5] the tenant's audit outbox         (hash, lua/includes/recordAudit)

  ARGV[1] updatedAt (ISO 8601)
  ARGV[2] the version id the change was computed from
  ARGV[3] the new version's id, '' when the definition does not change
  ARGV[4] the new definition (JSON), '' when it does not change
  ARGV[5] audit intent token, ARGV[6] audit intent (recorded when something changed)
  ARGV[7] most versions a workflow keeps (a new version beyond is refused)
  ARGV[8] number of fields F, then F groups of 2: field, value ('' for none)

  Returns { 1, before, after } (records as HGETALL's flat list) when applied,
          { 0 } when the workflow does not exist, { -1 } when its current version moved on
          (nothing written: recompute and retry), { -2 } when a new version would pass ARGV[7]
          (nothing written).
]]
-- @include "recordAudit"
local rcall = redis.call
if rcall('EXISTS', KEYS[1]) == 0 then return { 0 } end
if rcall('HGET', KEYS[1], 'versionId') ~= ARGV[2] then return { -1 } end
if ARGV[3] ~= '' and rcall('ZCARD', KEYS[2]) >= tonumber(ARGV[7]) then return { -2 } end
local before = rcall('HGETALL', KEYS[1])
local changed = false
for i = 0, tonumber(ARGV[8]) - 1 do
  local field, value = ARGV[9 + i * 2], ARGV[10 + i * 2]
  if rcall('HGET', KEYS[1], field) ~= value then
    rcall('HSET', KEYS[1], field, value)
    changed = true
  end
end
if ARGV[3] ~= '' then
  local version = rcall('HINCRBY', KEYS[1], 'version', 1)
  rcall('HSET', KEYS[3], 'id', ARGV[3], 'workflowId', rcall('HGET', KEYS[1], 'id'), 'version', tostring(version),
    'definition', ARGV[4], 'createdAt', ARGV[1])
  rcall('ZADD', KEYS[2], version, ARGV[3])
  rcall('HSET', KEYS[1], 'versionId', ARGV[3])
  changed = true
end
if changed then
  rcall('HSET', KEYS[1], 'updatedAt', ARGV[1])
  rcall('INCR', KEYS[4])
end
local reply = { 1, before, rcall('HGETALL', KEYS[1]) }
if changed then recordAudit(KEYS[5], ARGV[5], ARGV[6], reply) end
return reply
