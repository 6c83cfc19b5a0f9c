--[[
  Turns a tenant's required identity verification on or off, comparing with the stored value in the
  same atomic step: only a call that changes the value writes it and records its audit intent, so
  the entry's previous value is the one this write replaced (of concurrent toggles to one value,
  one changes it; the others write nothing).

  KEYS[1] the tenant's record ({w}:tenant:<id>, hash; `identityRequired` '1' when on, else off)
  KEYS[2] the workspace's audit outbox ({w}:outbox, lua/includes/recordAudit)

  ARGV[1] '1' to require verification, '0' not to
  ARGV[2] audit intent token, ARGV[3] audit intent (recorded when the value changes)

  Returns { 1 } when the value changed, { 0 } when it was already ARGV[1] (nothing written).
]]
-- @include "recordAudit"
local rcall = redis.call
local current = rcall('HGET', KEYS[1], 'identityRequired') == '1' and '1' or '0'
if current == ARGV[1] then return { 0 } end
rcall('HSET', KEYS[1], 'identityRequired', ARGV[1])
local reply = { 1 }
recordAudit(KEYS[2], ARGV[2], ARGV[3], reply)
return reply
