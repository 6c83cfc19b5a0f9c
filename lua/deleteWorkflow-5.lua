--[[
  Deletes a workflow: its record, its slug (only while the slug still names this workflow), its
  index entry and its version list, and bumps the automation version. The caller then deletes the
  version records it returns (no run starts once the record is gone; active runs find their
  version missing and are canceled with reason workflow_deleted).

  KEYS[1] workflow slug index of the tenant (hash slug -> workflow id)
  KEYS[2] workflow index of the tenant      (zset of workflow ids)
  KEYS[3] the workflow's record             (hash)
  KEYS[4] the workflow's versions           (zset version number -> version id)
  KEYS[5] the tenant's automation version   (string counter)

  ARGV[1] workflow id

  Returns { 1, record, versionIds } when deleted (record as HGETALL's flat list as it was),
          { 0 } when the workflow did not exist.
]]
local rcall = redis.call
local record = rcall('HGETALL', KEYS[3])
if #record == 0 then return { 0 } end
local slug = rcall('HGET', KEYS[3], 'slug')
if slug and rcall('HGET', KEYS[1], slug) == ARGV[1] then rcall('HDEL', KEYS[1], slug) end
rcall('ZREM', KEYS[2], ARGV[1])
local versions = rcall('ZRANGE', KEYS[4], 0, -1)
rcall('DEL', KEYS[3], KEYS[4])
rcall('INCR', KEYS[5])
return { 1, record, versions }
