--[[
  Creates a topic of a tenant unless its slug is taken.

  KEYS[1] topic slug index of the tenant (hash slug -> topic id)
  KEYS[2] topic index of the tenant      (zset, score 0, of topic ids)
  KEYS[3] the new topic's record         (hash)
  KEYS[4] the tenant's audit outbox      (hash, lua/includes/recordAudit)

  ARGV[1] topic id
  ARGV[2] slug
  ARGV[3] name ('' for none)
  ARGV[4] description ('' for none)
  ARGV[5] createdAt (ISO 8601)
  ARGV[6] audit intent token, ARGV[7] audit intent (recorded when the topic is created)

  Returns { 1, id } when created, { 0, existingId } when the slug was taken (nothing written).
]]
-- @include "recordAudit"
local rcall = redis.call
local existing = rcall('HGET', KEYS[1], ARGV[2])
if existing then return { 0, existing } end
rcall('HSET', KEYS[1], ARGV[2], ARGV[1])
rcall('ZADD', KEYS[2], 0, ARGV[1])
rcall('HSET', KEYS[3], 'id', ARGV[1], 'slug', ARGV[2], 'createdAt', ARGV[5], 'updatedAt', ARGV[5])
if ARGV[3] ~= '' then rcall('HSET', KEYS[3], 'name', ARGV[3]) end
if ARGV[4] ~= '' then rcall('HSET', KEYS[3], 'description', ARGV[4]) end
local reply = { 1, ARGV[1] }
recordAudit(KEYS[4], ARGV[6], ARGV[7], reply)
return reply
