--[[
  Moves every widget of one subscriber to another (an anonymous subscriber merged into the
  identified one), atomically and within the per-subscriber limit. A widget that is the same as
  one the target holds (the same push token; or, without one, the same kind, family and
  configuration: the rule of lua/registerWidget) is not moved but removed: the target's stays.
  When the target would hold more than the maximum, nothing changes. A moved widget is tagged with
  the target's sub_ id (`subscriber`, as lua/registerWidget tags one).

  KEYS[1] the source's widget index ({t}:sub-widgets:<from externalId>)
  KEYS[2] the target's widget index ({t}:sub-widgets:<to externalId>)

  ARGV[1] tenant base ({t}); a widget is the hash <base>:widget:<id> (streams/keys.ts `widget`)
  ARGV[2] the target's externalId
  ARGV[3] widgets a subscriber holds at most
  ARGV[4] '1' to check only (the merge's check before any of its writes): nothing is written
  ARGV[5] the target's sub_ id

  Returns { moved, removed } when applied, or would be when checking (0, 0 when the source has none),
          { -1, wouldHold } when the target would hold more than the maximum (nothing changed).
]]
local rcall = redis.call
local base = ARGV[1]
local function sameAs(a, b)
  if (a[3] or '') ~= '' or (b[3] or '') ~= '' then return (a[3] or '') == (b[3] or '') end
  return a[1] == b[1] and (a[2] or '') == (b[2] or '') and a[4] == b[4]
end
local held = {}
for _, id in ipairs(rcall('ZRANGE', KEYS[2], 0, -1)) do
  local w = rcall('HMGET', base .. ':widget:' .. id, 'kind', 'family', 'pushToken', 'configuration')
  if w[1] then held[#held + 1] = w end
end
local move, drop = {}, {}
for _, id in ipairs(rcall('ZRANGE', KEYS[1], 0, -1)) do
  local w = rcall('HMGET', base .. ':widget:' .. id, 'kind', 'family', 'pushToken', 'configuration')
  local duplicate = not w[1]
  for _, h in ipairs(held) do
    if not duplicate and sameAs(w, h) then duplicate = true end
  end
  if duplicate then drop[#drop + 1] = id else move[#move + 1] = id end
end
local wouldHold = rcall('ZCARD', KEYS[2]) + #move
if #move > 0 and wouldHold > tonumber(ARGV[3]) then return { -1, wouldHold } end
if ARGV[4] == '1' then return { #move, #drop } end
for _, id in ipairs(move) do
  rcall('HSET', base .. ':widget:' .. id, 'externalId', ARGV[2], 'subscriber', ARGV[5])
  rcall('ZADD', KEYS[2], 0, id)
end
for _, id in ipairs(drop) do rcall('DEL', base .. ':widget:' .. id) end
rcall('DEL', KEYS[1])
return { #move, #drop }
