--[[
  Creates a segment of a tenant unless its slug is taken, and bumps the tenant's automation
  version so workers reload their definitions. The backfill starts `pending`; the caller queues it
  (the backfill queue is a global key, outside this tenant's slot).

  KEYS[1] segment slug index of the tenant (hash slug -> segment id)
  KEYS[2] segment index of the tenant      (zset, score 0, of segment ids)
  KEYS[3] the new segment's record         (hash)
  KEYS[4] the tenant's automation version  (string counter)
  KEYS[5] the tenant's audit outbox        (hash, lua/includes/recordAudit)

  ARGV[1] segment id
  ARGV[2] slug
  ARGV[3] name ('' for none)
  ARGV[4] description ('' for none)
  ARGV[5] where (JSON of the expression)
  ARGV[6] backfill (JSON of the pending progress)
  ARGV[7] createdAt (ISO 8601)
  ARGV[8] most segments a tenant may have
  ARGV[9] audit intent token, ARGV[10] audit intent (recorded when the segment is created)

  Returns { 1, id } when created, { 0, existingId } when the slug was taken, { -1 } when the tenant
  has the most segments it may have (nothing written).
]]
-- @include "recordAudit"
local rcall = redis.call
local existing = rcall('HGET', KEYS[1], ARGV[2])
if existing then return { 0, existing } end
if rcall('ZCARD', KEYS[2]) >= tonumber(ARGV[8]) then return { -1 } end
rcall('HSET', KEYS[1], ARGV[2], ARGV[1])
rcall('ZADD', KEYS[2], 0, ARGV[1])
rcall('HSET', KEYS[3], 'id', ARGV[1], 'slug', ARGV[2], 'name', ARGV[3], 'description', ARGV[4], 'where', ARGV[5],
  'backfill', ARGV[6], 'createdAt', ARGV[7], 'updatedAt', ARGV[7])
rcall('INCR', KEYS[4])
local reply = { 1, ARGV[1] }
recordAudit(KEYS[5], ARGV[9], ARGV[10], reply)
return reply
