--[[
  Stores (or replaces) a tenant's APNs credentials, reading the ones it replaces in the same atomic
  step, so the audit entry's previous values are exactly what this write replaced (two concurrent
  writes never both report replacing the same credentials), and sending the stored credentials
  again writes nothing.

  KEYS[1] the tenant's APNs credentials ({t}:apns, hash)
  KEYS[2] the tenant's audit outbox ({t}:outbox, lua/includes/recordAudit)

  ARGV[1] audit intent token, ARGV[2] audit intent (recorded when the credentials are written)
  ARGV[3] the sealed private key the writer found stored and could open ('' for none): credentials
          whose public fields equal the new ones and whose sealed key is still that one are the same
          (no write); sealed under another encryption key, they are written again (re-sealed)
  ARGV[4] n, the number of public fields; ARGV[5 .. 4+n] their names, the first always set on stored
          credentials and the last (configuredAt) not compared
  then field/value pairs of the new record (the public fields among them)

  Returns { 1, values } when written (values: the public fields' previous values in ARGV order, nil
          where none were stored), { 0, values } when the same credentials were stored (nothing written).
]]
-- @include "recordAudit"
local rcall = redis.call
local n = tonumber(ARGV[4])
local names = { unpack(ARGV, 5, 4 + n) }
local previous = rcall('HMGET', KEYS[1], unpack(names))
local record = {}
for i = 5 + n, #ARGV, 2 do record[ARGV[i]] = ARGV[i + 1] end

if previous[1] and ARGV[3] ~= '' and rcall('HGET', KEYS[1], 'privateKey') == ARGV[3] then
  local same = true
  for i = 1, n - 1 do
    if previous[i] ~= record[names[i]] then same = false end
  end
  if same then return { 0, previous } end
end
rcall('DEL', KEYS[1])
rcall('HSET', KEYS[1], unpack(ARGV, 5 + n))
local reply = { 1, previous }
recordAudit(KEYS[2], ARGV[1], ARGV[2], reply)
return reply
