--[[
  Removes a tenant's APNs credentials, answering their public fields as they were (never the sealed
  key), so only the caller that removed them audits `apns.deleted`.

  KEYS[1] the tenant's APNs credentials ({t}:apns, hash)
  KEYS[2] the tenant's audit outbox ({t}:outbox, lua/includes/recordAudit)

  ARGV[1] audit intent token, ARGV[2] audit intent (recorded when the credentials are removed)
  ARGV[3..] the public fields to answer (the first one is always set on stored credentials)

  Returns { 1, values } when removed (values: the public fields' values in ARGV order), { 0 } when
          no credentials were stored (nothing written).
]]
-- @include "recordAudit"
local rcall = redis.call
local values = rcall('HMGET', KEYS[1], unpack(ARGV, 3))
if not values[1] then return { 0 } end
rcall('DEL', KEYS[1])
local reply = { 1, values }
recordAudit(KEYS[2], ARGV[1], ARGV[2], reply)
return reply
