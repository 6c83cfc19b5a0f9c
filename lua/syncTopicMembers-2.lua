--[[
  Brings a topic's member set in line with membership already written in the subscribers'
  partitions: joins (ZADD NX, so a member keeps its first join time) and leaves (ZREM). Writes
  nothing once the topic is deleted, so a late call cannot bring back a deleted topic's members.

  KEYS[1] the topic's record  (hash)
  KEYS[2] the topic's members (zset externalId -> join ms * 1000 + position in the call)

  ARGV[1] number of changes N, then N groups of 3: '+' (join) or '-' (leave), score ('' for a
          leave), externalId

  Returns { 1, memberCount } after the changes, { -1 } when the topic does not exist.
]]
local rcall = redis.call
if rcall('EXISTS', KEYS[1]) == 0 then return { -1 } end
for i = 0, tonumber(ARGV[1]) - 1 do
  local op, score, member = ARGV[2 + i * 3], ARGV[3 + i * 3], ARGV[4 + i * 3]
  if op == '+' then
    rcall('ZADD', KEYS[2], 'NX', score, member)
  elseif op == '-' then
    rcall('ZREM', KEYS[2], member)
  else
    return redis.error_reply('syncTopicMembers: unknown op ' .. tostring(op))
  end
end
return { 1, rcall('ZCARD', KEYS[2]) }
