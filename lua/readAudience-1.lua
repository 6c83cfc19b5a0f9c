--[[
  What a fan-out needs of a chunk's subscribers that fall in one partition, in one call instead of
  five commands per subscriber (existence, preferences, subscription ids, each subscription record):
  read-only, so a dispatcher killed after it changes nothing.

  KEYS[1] subscriber hash ({pN}:subs, field tenant|externalId -> sub_ id: the subscriber exists)

  ARGV[1] partition key base ({pN} with the key prefix): the subscriber record, its subscription
          set and the subscription records are built from it (names of streams/keys.ts)
  ARGV[2] tenant id
  ARGV[3..] externalIds

  Returns one item per externalId, in order: { 0 } when the subscriber does not exist, else
  { 1, preferences JSON or nil, { subscription record (HGETALL, flat), ... }, sub_ id } with the
  records of its subscription set that still exist, and the subscriber's id (its `$send` is written
  only while that one exists: lua/ingestEvents).
]]
local rcall = redis.call
local subs, base, tenant = KEYS[1], ARGV[1], ARGV[2]
local out = {}
for i = 3, #ARGV do
  local x = ARGV[i]
  local sub = rcall('HGET', subs, tenant .. '|' .. x)
  if sub then
    local records = {}
    for _, id in ipairs(rcall('SMEMBERS', base .. ':sub-scrs:' .. tenant .. ':' .. x)) do
      local h = rcall('HGETALL', base .. ':scr:' .. tenant .. ':' .. id)
      if #h > 0 then records[#records + 1] = h end
    end
    out[#out + 1] = { 1, rcall('HGET', base .. ':sub:' .. tenant .. ':' .. x, 'preferences'), records, sub }
  else
    out[#out + 1] = { 0 }
  end
end
return out
