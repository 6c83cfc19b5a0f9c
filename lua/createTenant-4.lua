--[[
  Creates a tenant of a workspace unless its slug is taken.

  KEYS[1] tenant slug index (hash slug -> tenant id) of the workspace
  KEYS[2] tenant index (zset of tenant ids) of the workspace
  KEYS[3] the new tenant's record (hash)
  KEYS[4] the workspace's audit outbox (hash, lua/includes/recordAudit)

  ARGV[1] tenant id
  ARGV[2] slug
  ARGV[3] workspace id
  ARGV[4] createdAt (ISO 8601)
  ARGV[5] createdAt (ms)
  ARGV[6] audit intent token, ARGV[7] audit intent (recorded when the tenant is created)

  Returns { 1, id } when created, { 0, existingId } when the slug was taken.
]]
-- @include "recordAudit"
local rcall = redis.call
local existing = rcall('HGET', KEYS[1], ARGV[2])
if existing then return { 0, existing } end
rcall('HSET', KEYS[1], ARGV[2], ARGV[1])
rcall('ZADD', KEYS[2], 0, ARGV[1])
rcall('HSET', KEYS[3], 'id', ARGV[1], 'slug', ARGV[2], 'workspaceId', ARGV[3], 'createdAt', ARGV[4], 'createdAtMs', ARGV[5])
local reply = { 1, ARGV[1] }
recordAudit(KEYS[4], ARGV[6], ARGV[7], reply)
return reply
