--[[
  Removes every widget of a subscriber (its subscriber is being deleted), atomically.

  KEYS[1] the subscriber's widget index ({t}:sub-widgets:<externalId>, zset score 0 of widget ids)

  ARGV[1] tenant base ({t}); a widget is the hash <base>:widget:<id> (streams/keys.ts `widget`)

  Returns the number of widgets removed.
]]
local rcall = redis.call
local ids = rcall('ZRANGE', KEYS[1], 0, -1)
for _, id in ipairs(ids) do rcall('DEL', ARGV[1] .. ':widget:' .. id) end
rcall('DEL', KEYS[1])
return #ids
