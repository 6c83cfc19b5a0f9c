--[[
  Up to `count` members of a scored set after a cursor, newest first (by score descending, then by
  member bytes descending, as Redis orders them), with their scores: streams/scored-index.ts
  `entriesAfter`. A cursor whose member is still in the set at the cursor's score continues from
  that member's rank, in one step whatever the number of members sharing its score: the members
  sharing the cursor's score were read whole and filtered, and a message's deliveries made before
  session 55 all share score 0, so each page read all of them (probe CG: 200,000 deliveries, 0.4 s
  a page). A cursor whose member left the set (expired, moved) is placed by its score and member.

  KEYS[1] the scored set
  ARGV[1] the cursor's score ('' for the first page), ARGV[2] its member, ARGV[3] count

  Returns { member, score, member, score, … }.
]]
local rcall = redis.call
local key, count = KEYS[1], tonumber(ARGV[3])
if ARGV[1] == '' then return rcall('ZRANGE', key, '+inf', '-inf', 'BYSCORE', 'REV', 'LIMIT', 0, count, 'WITHSCORES') end
local score = rcall('ZSCORE', key, ARGV[2])
if score and tonumber(score) == tonumber(ARGV[1]) then
  local rank = rcall('ZREVRANK', key, ARGV[2])
  return rcall('ZRANGE', key, rank + 1, rank + count, 'REV', 'WITHSCORES')
end
-- the member left: those sharing its score that sort after it, then those below its score
local out = {}
local tied = rcall('ZRANGE', key, ARGV[1], ARGV[1], 'BYSCORE', 'REV', 'WITHSCORES')
for i = 1, #tied, 2 do
  if #out >= 2 * count then break end
  if tied[i] < ARGV[2] then
    out[#out + 1] = tied[i]
    out[#out + 1] = tied[i + 1]
  end
end
if #out >= 2 * count then return out end
local rest = rcall('ZRANGE', key, '(' .. ARGV[1], '-inf', 'BYSCORE', 'REV', 'LIMIT', 0, count - #out / 2, 'WITHSCORES')
for i = 1, #rest do out[#out + 1] = rest[i] end
return out
