--[[
  Changes fields of a source if it exists. `updatedAt` moves only when a value actually changes.
  A new `secret` retires the current one as lua/includes/retireSecret says (it keeps verifying for
  24 hours, at most ARGV[6] retired at once), so a sender can move to the new secret without
  rejected requests. Before and after are read in the same step, so the audit entry reports
  exactly this change.

  KEYS[1] the source's record (hash)
  KEYS[2] the tenant's audit outbox (hash, lua/includes/recordAudit)

  ARGV[1] updatedAt (ISO 8601)
  ARGV[2] audit intent token, ARGV[3] audit intent (recorded when a value changed)
  ARGV[4] now (ms), ARGV[5] how long a retired secret keeps verifying (ms), ARGV[6] most retired secrets kept
  ARGV[7] number of fields F, then F groups of 2: field, value ('' removes the field)
  ARGV[8 + 2F] '1': revoke the retired secrets (they stop verifying now; a change when one was live)

  Returns { 1, before, after } (records as HGETALL's flat list, without secrets) when the source exists,
          { 0 } when it does not (nothing written).
]]
-- @include "recordAudit"
-- @include "retireSecret"
-- @include "changeFields"
-- @include "withoutSecrets"
local rcall = redis.call
if rcall('EXISTS', KEYS[1]) == 0 then return { 0 } end
local before = withoutSecrets(rcall('HGETALL', KEYS[1]))
local changed = changeFields(KEYS[1], 8, tonumber(ARGV[7]), function(field, value)
  if field == 'secret' then
    retireSecret(KEYS[1], value, ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6]))
    rcall('HSET', KEYS[1], 'secretUpdatedAt', ARGV[1])
  else
    rcall('HSET', KEYS[1], field, value)
  end
end)
if ARGV[8 + 2 * tonumber(ARGV[7])] == '1' then
  local retired = rcall('HMGET', KEYS[1], 'retiredSecrets', 'previousSecret', 'rotatedAt')
  local live = false
  if retired[1] and retired[1] ~= '' then
    for _, r in ipairs(cjson.decode(retired[1])) do
      if tonumber(r.expiresAt) > tonumber(ARGV[4]) then live = true end
    end
  end
  -- a record rotated by an earlier version: one retired secret, verifying `validity` from `rotatedAt`
  if retired[2] and retired[2] ~= '' and retired[3] and tonumber(retired[3]) + tonumber(ARGV[5]) > tonumber(ARGV[4]) then live = true end
  rcall('HDEL', KEYS[1], 'retiredSecrets', 'previousSecret')
  if live then
    rcall('HSET', KEYS[1], 'secretUpdatedAt', ARGV[1])
    changed = true
  end
end
if changed then rcall('HSET', KEYS[1], 'updatedAt', ARGV[1]) end
local reply = { 1, before, withoutSecrets(rcall('HGETALL', KEYS[1])) }
if changed then recordAudit(KEYS[2], ARGV[2], ARGV[3], reply) end
return reply
