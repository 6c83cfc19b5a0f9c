--[[
  What the automation step (and a `to: { where }` fan-out) evaluates expressions against, for a
  chunk of one partition's subscribers of one tenant, in one call and one reply: instead of four
  commands per subscriber (record, topic set, subscription set, automation hash) and one per
  subscription record, whose replies the worker would decode element by element, it answers one
  JSON document (decoded with one JSON.parse). Read-only: a worker killed after it changes nothing.

  KEYS[1] subscriber hash ({pN}:subs), only to name the partition's slot

  ARGV[1] partition key base ({pN} with the key prefix): the record, topic set, subscription set,
          subscription records and automation hash are built from it (names of streams/keys.ts)
  ARGV[2] tenant id
  ARGV[3] n, how many topic ids follow
  ARGV[4..3+n] the topic ids the expressions name: only these are looked up in each subscriber's
          topic set (SMISMEMBER), so a subscriber in tens of thousands of topics costs no more than
          one in a few (the whole set was read until session 62: 36-104 ms per event at 50k topics)
  ARGV[4+n] what to read beside the record: subscriptions ('1'/'0')
  ARGV[5+n] automation hash ('1'/'0')
  ARGV[6+n..] externalIds

  Returns a JSON array, one object per externalId in order:
    r  the record (HGETALL as an object; empty when the subscriber does not exist)
    t  of the topic ids asked, those the subscriber is in (when any were asked)
    s  the subscriptions it holds (when asked), each [channel, enabled, platform, invalidatedAt]:
       a set member whose record is gone, or held by another subscriber of the partition (a token
       moving, `holder`), is not this subscriber's (streams/subscriptions.ts heldBy)
    a  automation state fields, c  counter fields (those with a `|`) (when asked)
  An empty list comes back as {} (cjson cannot tell an empty array from an empty object).
]]
local rcall = redis.call
local base, tenant = ARGV[1], ARGV[2]
local n = tonumber(ARGV[3])
local topicIds = {}
for i = 1, n do topicIds[i] = ARGV[3 + i] end
local withSubscriptions, withAutomation = ARGV[4 + n] == '1', ARGV[5 + n] == '1'
local find = string.find

local function object(flat)
  local h = {}
  for i = 1, #flat, 2 do h[flat[i]] = flat[i + 1] end
  return h
end

local out = {}
for i = 6 + n, #ARGV do
  local x = ARGV[i]
  local sub = tenant .. ':' .. x
  local s = { r = object(rcall('HGETALL', base .. ':sub:' .. sub)) }
  if n > 0 then
    local held = {}
    for from = 1, n, 1000 do -- unpack is bounded by Lua's C stack (~8000 values)
      local to = math.min(from + 999, n)
      local flags = rcall('SMISMEMBER', base .. ':sub-topics:' .. sub, unpack(topicIds, from, to))
      for j = 1, #flags do if flags[j] == 1 then held[#held + 1] = topicIds[from + j - 1] end end
    end
    s.t = held
  end
  if withSubscriptions then
    local held = {}
    for _, id in ipairs(rcall('SMEMBERS', base .. ':sub-scrs:' .. sub)) do
      local h = rcall('HMGET', base .. ':scr:' .. tenant .. ':' .. id, 'id', 'holder', 'channel', 'enabled', 'platform', 'invalidatedAt')
      if h[1] and h[1] ~= '' and (not h[2] or h[2] == '' or h[2] == x) then
        held[#held + 1] = { h[3] or '', h[4] or '', h[5] or '', h[6] or '' }
      end
    end
    s.s = held
  end
  if withAutomation then
    local flat = rcall('HGETALL', base .. ':auto:' .. sub)
    local a, c = {}, {}
    for j = 1, #flat, 2 do
      local f = flat[j]
      if find(f, '|', 1, true) then c[f] = flat[j + 1] else a[f] = flat[j + 1] end
    end
    s.a, s.c = a, c
  end
  out[#out + 1] = s
end
return cjson.encode(out)
