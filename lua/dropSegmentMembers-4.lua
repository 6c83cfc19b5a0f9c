--[[
  The partition half of a segment delete (streams/segments.ts `dropSegmentMembers`), after
  lua/deleteSegment took the record away in the tenant's slot; one call per partition, idempotent
  (the audit outbox sweeper runs it again for a delete whose process died before every partition
  had it). Atomically:
  - the segment is listed in the partition's deleted segments (score: ms of the deletion, the first
    call's), so lua/commitAutomation adds no member and lists no id of it afterwards: a worker that
    loaded the definitions before the delete may commit after it (probe EF: 3 of 8 deletes during a
    backfill left member sets behind, for good for idle subscribers);
  - its member set moves to the gone-members set, listed for the sweeper to visit
    (`sweepDeletedSegments` takes the id out of each former member's `segs`), so the members are
    gone from every reader at once.

  KEYS[1] the segment's member set in this partition ({pN}:segm:<tenant>:<id>)
  KEYS[2] the partition's deleted segments        ({pN}:segs-gone, zset `<tenant>|<id>` -> ms)
  KEYS[3] the segment's gone-members set          ({pN}:segm-gone:<tenant>:<id>)
  KEYS[4] the gone-members sets left to visit     ({pN}:segs-gone:visit, set of `<tenant>|<id>`)

  ARGV[1] `<tenant>|<segment id>`   ARGV[2] now (ms)

  Returns the number of members moved.
]]
local rcall = redis.call
rcall('ZADD', KEYS[2], 'NX', ARGV[2], ARGV[1])
local n = rcall('ZCARD', KEYS[1])
if n == 0 then return 0 end
if rcall('EXISTS', KEYS[3]) == 1 then
  rcall('ZUNIONSTORE', KEYS[3], 2, KEYS[3], KEYS[1])
  rcall('DEL', KEYS[1])
else
  rcall('RENAME', KEYS[1], KEYS[3])
end
rcall('SADD', KEYS[4], ARGV[1])
return n
