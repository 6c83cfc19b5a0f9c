--[[
  Deletes a source: its record and its place in the tenant's index.

  KEYS[1] source index of the tenant (zset)
  KEYS[2] the source's record        (hash)
  KEYS[3] the tenant's audit outbox  (hash, lua/includes/recordAudit)

  ARGV[1] source id
  ARGV[2] audit intent token, ARGV[3] audit intent

  Returns { 1, record } (HGETALL's flat list, as it was, without secrets) when it existed, { 0 } when not.
]]
-- @include "recordAudit"
-- @include "withoutSecrets"
local rcall = redis.call
local record = rcall('HGETALL', KEYS[2])
if #record == 0 then return { 0 } end
rcall('DEL', KEYS[2])
rcall('ZREM', KEYS[1], ARGV[1])
local reply = { 1, withoutSecrets(record) }
recordAudit(KEYS[3], ARGV[2], ARGV[3], reply)
return reply
