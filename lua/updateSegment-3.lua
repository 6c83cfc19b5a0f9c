--[[
  Changes fields of a segment's record if the segment exists. `updatedAt` moves, and the tenant's
  automation version is bumped, only when a value actually changes. A new `where` resets the
  backfill to pending (the caller queues it). A `where` is compared as JSON values (the same rule
  with its keys in another order is no change), here and not by the caller: a comparison with a
  read taken before the call dropped a rule that a concurrent update had changed meanwhile. Before
  and after are read in the same step, so the audit entry (recorded in the outbox with the change)
  reports exactly what this call changed.

  KEYS[1] the segment's record             (hash)
  KEYS[2] the tenant's automation version  (string counter)
  KEYS[3] the tenant's audit outbox        (hash, lua/includes/recordAudit)

  ARGV[1] updatedAt (ISO 8601)
  ARGV[2] backfill (JSON of the pending progress), written when `where` changes
  ARGV[3] audit intent token, ARGV[4] audit intent (recorded when a value changed)
  ARGV[5] number of fields F, then F groups of 2: field, value ('' for none)

  Returns { 1, before, after, whereChanged (0|1) } (records as HGETALL's flat list) when the
          segment exists, { 0 } when it does not (nothing written).
]]
-- @include "recordAudit"
local rcall = redis.call
-- equal JSON values (objects whatever their key order)
local function same(a, b)
  if type(a) ~= type(b) then return false end
  if type(a) ~= 'table' then return a == b end
  for k, v in pairs(a) do if not same(v, b[k]) then return false end end
  for k in pairs(b) do if a[k] == nil then return false end end
  return true
end
if rcall('EXISTS', KEYS[1]) == 0 then return { 0 } end
local before = rcall('HGETALL', KEYS[1])
local changed = false
local whereChanged = 0
for i = 0, tonumber(ARGV[5]) - 1 do
  local field, value = ARGV[6 + i * 2], ARGV[7 + i * 2]
  local current = rcall('HGET', KEYS[1], field)
  local differs = current ~= value
  if differs and field == 'where' and current then differs = not same(cjson.decode(current), cjson.decode(value)) end
  if differs then
    rcall('HSET', KEYS[1], field, value)
    changed = true
    if field == 'where' then whereChanged = 1 end
  end
end
if whereChanged == 1 then rcall('HSET', KEYS[1], 'backfill', ARGV[2]) end
if changed then
  rcall('HSET', KEYS[1], 'updatedAt', ARGV[1])
  rcall('INCR', KEYS[2])
end
local reply = { 1, before, rcall('HGETALL', KEYS[1]), whereChanged }
if changed then recordAudit(KEYS[3], ARGV[3], ARGV[4], reply) end
return reply
