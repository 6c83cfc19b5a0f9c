--[[
  Up to `count` members of a scored set after a cursor, newest first (by score descending, then by
  member bytes descending, as Redis orders them), with their scores: streams/scored-index.ts
  `entriesAfter`. A cursor whose member is still in the set at the cursor's score continues from
  that member's rank, in one step whatever the number of members sharing its score: the members
  sharing the cursor's score were read whole and filtered, and a message's deliveries made before
  session 55 all share score 0, so each page read all of them (probe CG: 200,000 deliveries, 0.4 s
  a page). A cursor whose member left the set (expired, moved) is placed by its score and member
  by halving the rank range of its score's members (O(log n) reads of one member each).

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
-- The member left: placed by its score and member. The members sharing its score hold the ranks
-- right after those above it (newest first), in member bytes descending: the first of them below
-- the cursor's member is found by halving that range (a few ZRANGE calls of one member, however
-- many share the score; reading the tied group whole cost 0.37 s a page for 200,000 members,
-- probe DA), and the page goes on from there into the lower scores.
local function below(a, b) -- a sorts before b as Redis orders members (bytes, not the locale's collation)
  for i = 1, math.min(#a, #b) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a < #b
end
local lo = rcall('ZCOUNT', key, '(' .. ARGV[1], '+inf')
local hi = lo + rcall('ZCOUNT', key, ARGV[1], ARGV[1])
while lo < hi do
  local mid = math.floor((lo + hi) / 2)
  if below(rcall('ZRANGE', key, mid, mid, 'REV')[1], ARGV[2]) then hi = mid else lo = mid + 1 end
end
return rcall('ZRANGE', key, lo, lo + count - 1, 'REV', 'WITHSCORES')
