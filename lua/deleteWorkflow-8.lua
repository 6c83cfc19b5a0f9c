--[[
  Deletes a workflow: its record, its slug (only while the slug still names this workflow), its
  index entry and its version list, keeps the `wait` and `cancelOn` names of its versions watched
  for a while (so the event an active run of it waits for reaches that run), and bumps the
  automation version. The caller then deletes the version records it returns (no run starts once
  the record is gone; active runs find their workflow missing at their next step and are canceled
  with reason workflow_deleted). A compare-and-set on the current version id: the names were read
  from the versions the caller saw, so a version made meanwhile makes the caller read them again.

  KEYS[1] workflow slug index of the tenant (hash slug -> workflow id)
  KEYS[2] workflow index of the tenant      (zset of workflow ids)
  KEYS[3] the workflow's record             (hash)
  KEYS[4] the workflow's versions           (zset version number -> version id)
  KEYS[5] the tenant's automation version   (string counter)
  KEYS[6] deleted workflows' watched names  (zset `<workflow id>|<event name>` -> deletion ms)
  KEYS[7] the record of the version ARGV[2] (hash), read for the answer and the audit entry
  KEYS[8] the tenant's audit outbox         (hash, lua/includes/recordAudit)

  ARGV[1] workflow id
  ARGV[2] the current version id the caller read the names with
  ARGV[3] now (ms)
  ARGV[4] how long names stay watched (ms): older ones are dropped
  ARGV[5] most names kept (the newest)
  ARGV[6] audit intent token, ARGV[7] audit intent (recorded when the workflow is deleted)
  ARGV[8..] the `wait` and `cancelOn` event names of the workflow's versions, as `<workflow id>|<name>`

  Returns { 1, record, versionIds, version } when deleted (record and its current version's record
          as HGETALL's flat lists as they were),
          { 0 } when the workflow did not exist,
          { -1 } when its current version is no longer ARGV[2] (nothing written: read again).
]]
-- @include "unlistSlugged"
-- @include "recordAudit"
local rcall = redis.call
local record = rcall('HGETALL', KEYS[3])
if #record == 0 then return { 0 } end
if rcall('HGET', KEYS[3], 'versionId') ~= ARGV[2] then return { -1 } end
unlistSlugged(KEYS[1], KEYS[2], KEYS[3], ARGV[1])
local versions = rcall('ZRANGE', KEYS[4], 0, -1)
rcall('DEL', KEYS[3], KEYS[4])
local at = tonumber(ARGV[3])
for i = 8, #ARGV do rcall('ZADD', KEYS[6], at, ARGV[i]) end
rcall('ZREMRANGEBYSCORE', KEYS[6], '-inf', '(' .. (at - tonumber(ARGV[4])))
rcall('ZREMRANGEBYRANK', KEYS[6], 0, -(tonumber(ARGV[5]) + 1))
rcall('INCR', KEYS[5])
local reply = { 1, record, versions, rcall('HGETALL', KEYS[7]) }
recordAudit(KEYS[8], ARGV[6], ARGV[7], reply)
return reply
