--[[
  One page of the sweep of a deleted segment's former members in one partition
  (streams/segments.ts `sweepDeletedSegments`): the segment id leaves each one's `segs` (its
  automation hash), then the page leaves the gone-members set; once that is empty the segment
  leaves the list of sets to visit. Atomic per page, so a commit of the same hash
  (lua/commitAutomation, which writes `segs` whole) is either before it, and its `segs` loses the
  id here, or after it, and drops the id itself (the segment is in the partition's deleted
  segments). Idempotent: a sweep killed midway visits nothing twice but what it did not remove.

  KEYS[1] the segment's gone-members set          ({pN}:segm-gone:<tenant>:<id>, members `<sub_ id>|<externalId>`)
  KEYS[2] the gone-members sets left to visit     ({pN}:segs-gone:visit)

  ARGV[1] partition key base ({pN} with the key prefix; automation hashes are
          `<base>:auto:<tenant>:<externalId>`, streams/keys.ts)
  ARGV[2] tenant id   ARGV[3] segment id   ARGV[4] the most members to visit

  Returns { visited, left }.
]]
local rcall = redis.call
local base, tenant, id = ARGV[1], ARGV[2], ARGV[3]
local page = rcall('ZRANGE', KEYS[1], 0, tonumber(ARGV[4]) - 1)
for _, member in ipairs(page) do
  local cut = string.find(member, '|', 1, true)
  local segs, autoKey = nil, nil
  if cut then
    autoKey = base .. ':auto:' .. tenant .. ':' .. string.sub(member, cut + 1)
    segs = rcall('HGET', autoKey, 'segs')
  end
  if segs and string.find(segs, id, 1, true) then
    local kept = {}
    for _, s in ipairs(cjson.decode(segs)) do
      if s ~= id then kept[#kept + 1] = s end
    end
    -- cjson writes an empty table as {}; `segs` is a JSON array
    rcall('HSET', autoKey, 'segs', #kept == 0 and '[]' or cjson.encode(kept))
  end
end
if #page > 0 then rcall('ZREM', KEYS[1], unpack(page)) end
local left = rcall('ZCARD', KEYS[1])
if left == 0 then rcall('SREM', KEYS[2], tenant .. '|' .. id) end
return { #page, left }
