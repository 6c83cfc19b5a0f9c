--[[
  Deletes a topic: its record, its slug (only while the slug still names this topic), its index
  entry and its member set (UNLINK: a large set is freed in the background). Subscribers' own
  topic sets keep the id; readers ignore ids of topics that no longer exist.

  KEYS[1] topic slug index of the tenant (hash slug -> topic id)
  KEYS[2] topic index of the tenant      (zset of topic ids)
  KEYS[3] the topic's record             (hash)
  KEYS[4] the topic's members            (zset externalId -> join score)

  ARGV[1] topic id

  Returns { 1, record, members } when deleted (record as HGETALL's flat list as it was, members
          the member count it had), { 0 } when the topic did not exist.
]]
local rcall = redis.call
local record = rcall('HGETALL', KEYS[3])
if #record == 0 then return { 0 } end
local slug = rcall('HGET', KEYS[3], 'slug')
if slug and rcall('HGET', KEYS[1], slug) == ARGV[1] then rcall('HDEL', KEYS[1], slug) end
rcall('ZREM', KEYS[2], ARGV[1])
local members = rcall('ZCARD', KEYS[4])
rcall('UNLINK', KEYS[3], KEYS[4])
return { 1, record, members }
