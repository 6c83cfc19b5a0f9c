--[[
  Creates a workflow of a tenant with its version 1 unless its slug is taken, and bumps the
  tenant's automation version so workers reload their definitions.

  KEYS[1] workflow slug index of the tenant (hash slug -> workflow id)
  KEYS[2] workflow index of the tenant      (zset, score 0, of workflow ids)
  KEYS[3] the new workflow's record         (hash)
  KEYS[4] the record of its version 1       (hash)
  KEYS[5] the workflow's versions           (zset version number -> version id)
  KEYS[6] the tenant's automation version   (string counter)
  KEYS[7] the tenant's audit outbox         (hash, lua/includes/recordAudit)

  ARGV[1] workflow id
  ARGV[2] slug
  ARGV[3] name ('' for none)
  ARGV[4] description ('' for none)
  ARGV[5] enabled ('1' or '0')
  ARGV[6] version id of version 1
  ARGV[7] definition (JSON { trigger, steps, cancelOn? })
  ARGV[8] createdAt (ISO 8601)
  ARGV[9] most workflows a tenant may have
  ARGV[10] audit intent token, ARGV[11] audit intent (recorded when the workflow is created)

  Returns { 1, id } when created, { 0, existingId } when the slug was taken, { -1 } when the tenant
  has the most workflows it may have (nothing written).
]]
-- @include "recordAudit"
local rcall = redis.call
local existing = rcall('HGET', KEYS[1], ARGV[2])
if existing then return { 0, existing } end
if rcall('ZCARD', KEYS[2]) >= tonumber(ARGV[9]) then return { -1 } end
rcall('HSET', KEYS[1], ARGV[2], ARGV[1])
rcall('ZADD', KEYS[2], 0, ARGV[1])
rcall('HSET', KEYS[3], 'id', ARGV[1], 'slug', ARGV[2], 'name', ARGV[3], 'description', ARGV[4], 'enabled', ARGV[5],
  'version', '1', 'versionId', ARGV[6], 'createdAt', ARGV[8], 'updatedAt', ARGV[8])
rcall('HSET', KEYS[4], 'id', ARGV[6], 'workflowId', ARGV[1], 'version', '1', 'definition', ARGV[7], 'createdAt', ARGV[8])
rcall('ZADD', KEYS[5], 1, ARGV[6])
rcall('INCR', KEYS[6])
local reply = { 1, ARGV[1] }
recordAudit(KEYS[7], ARGV[10], ARGV[11], reply)
return reply
