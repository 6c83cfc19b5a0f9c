--[[
  Deletes a segment's tenant-slot state: its record, its slug (only while the slug still names
  this segment) and its index entry, and bumps the automation version. The caller then removes
  the per-partition member sets and the backfill queue entry (other slots).

  KEYS[1] segment slug index of the tenant (hash slug -> segment id)
  KEYS[2] segment index of the tenant      (zset of segment ids)
  KEYS[3] the segment's record             (hash)
  KEYS[4] the tenant's automation version  (string counter)
  KEYS[5] the tenant's audit outbox        (hash, lua/includes/recordAudit)

  ARGV[1] segment id
  ARGV[2] audit intent token, ARGV[3] audit intent (recorded when the segment is deleted)

  Returns { 1, record } when deleted (record as HGETALL's flat list as it was), { 0 } when the
          segment did not exist.
]]
-- @include "unlistSlugged"
-- @include "recordAudit"
local rcall = redis.call
local record = rcall('HGETALL', KEYS[3])
if #record == 0 then return { 0 } end
unlistSlugged(KEYS[1], KEYS[2], KEYS[3], ARGV[1])
rcall('DEL', KEYS[3])
rcall('INCR', KEYS[4])
local reply = { 1, record }
recordAudit(KEYS[5], ARGV[2], ARGV[3], reply)
return reply
