--[[
  Creates a source of a tenant and records its audit intent, unless the tenant has its most.

  KEYS[1] source index of the tenant (zset, score 0, of source ids)
  KEYS[2] the new source's record    (hash)
  KEYS[3] the tenant's audit outbox  (hash, lua/includes/recordAudit)

  ARGV[1] source id
  ARGV[2] audit intent token, ARGV[3] audit intent
  ARGV[4] most sources a tenant may have
  ARGV[5] number of fields F, then F groups of 2: field, value (fields with '' are not written)

  Returns { 1, id } when created, { 0 } when the tenant has its most already (nothing written).
]]
-- @include "recordAudit"
local rcall = redis.call
if rcall('ZCARD', KEYS[1]) >= tonumber(ARGV[4]) then return { 0 } end
local fields = {}
for i = 0, tonumber(ARGV[5]) - 1 do
  local value = ARGV[7 + i * 2]
  if value ~= '' then
    fields[#fields + 1] = ARGV[6 + i * 2]
    fields[#fields + 1] = value
  end
end
rcall('HSET', KEYS[2], unpack(fields))
rcall('ZADD', KEYS[1], 0, ARGV[1])
local reply = { 1, ARGV[1] }
recordAudit(KEYS[3], ARGV[2], ARGV[3], reply)
return reply
