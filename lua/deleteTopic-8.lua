--[[
  Deletes a topic: its record, its slug (only while the slug still names this topic) and its index
  entry. Its member set is renamed to the topic's gone-members set and the id listed in the tenant's
  deleted topics, for the worker's sweeper to take the id out of each member's own topic set, a page
  at a time, then drop the set (streams/topic-members.ts `sweepDeletedTopics`; until session 52 the
  ids stayed for good, probe AR: one subscriber of 300 short-lived topics held 300). Until then
  readers ignore ids of topics that no longer exist.

  Segments whose rule names the topic's slug have members chosen by it: their backfill is reset to
  pending in the same step (the caller queues it: the backfill queue is a global key, outside this
  tenant's slot), so every subscriber is evaluated again without the topic, and the tenant's
  automation version is bumped.

  KEYS[1] topic slug index of the tenant (hash slug -> topic id)
  KEYS[2] topic index of the tenant      (zset of topic ids)
  KEYS[3] the topic's record             (hash)
  KEYS[4] the topic's members            (zset externalId -> join score)
  KEYS[5] the tenant's automation version (string counter)
  KEYS[6] the tenant's audit outbox      (hash, lua/includes/recordAudit)
  KEYS[7] the topic's gone-members set   (zset, the member set renamed)
  KEYS[8] the tenant's deleted topics    (set of topic ids whose members' sets still name them)

  ARGV[1] topic id
  ARGV[2] backfill (JSON of the pending progress)
  ARGV[3] audit intent token, ARGV[4] audit intent (recorded when the topic is deleted)
  ARGV[5..] records of the tenant's segments naming the slug (same slot: `{t:<tenant>}:seg:<id>`);
          one that no longer exists is skipped

  Returns { 1, record, members, reset } when deleted (record as HGETALL's flat list as it was,
          members the member count it had, reset the number of segments whose backfill was
          reset), { 0 } when the topic did not exist.
]]
-- @include "unlistSlugged"
-- @include "recordAudit"
local rcall = redis.call
local record = rcall('HGETALL', KEYS[3])
if #record == 0 then return { 0 } end
unlistSlugged(KEYS[1], KEYS[2], KEYS[3], ARGV[1])
local members = rcall('ZCARD', KEYS[4])
rcall('UNLINK', KEYS[3])
if members > 0 then
  rcall('RENAME', KEYS[4], KEYS[7])
  rcall('SADD', KEYS[8], ARGV[1])
end
local reset = 0
for i = 5, #ARGV do
  if rcall('EXISTS', ARGV[i]) == 1 then
    rcall('HSET', ARGV[i], 'backfill', ARGV[2])
    rcall('HDEL', ARGV[i], 'backfillCursor')
    reset = reset + 1
  end
end
if reset > 0 then rcall('INCR', KEYS[5]) end
local reply = { 1, record, members, reset }
recordAudit(KEYS[6], ARGV[3], ARGV[4], reply)
return reply
