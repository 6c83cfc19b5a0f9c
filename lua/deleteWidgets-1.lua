--[[
  Removes the widgets of a deleted subscriber, atomically: those tagged with its sub_ id, and those
  registered before widgets carried one (no `subscriber` field). A widget tagged with another sub_ id
  belongs to a subscriber created again under the same externalId after the delete, and stays.
  Idempotent: the delete's writer and the cleanup sweeper may both run it.

  KEYS[1] the subscriber's widget index ({t}:sub-widgets:<externalId>, zset score 0 of widget ids)

  ARGV[1] tenant base ({t}); a widget is the hash <base>:widget:<id> (streams/keys.ts `widget`)
  ARGV[2] the deleted subscriber's sub_ id

  Returns the number of widgets removed.
]]
local rcall = redis.call
local removed = 0
for _, id in ipairs(rcall('ZRANGE', KEYS[1], 0, -1)) do
  local key = ARGV[1] .. ':widget:' .. id
  local owner = rcall('HGET', key, 'subscriber')
  if not owner or owner == '' or owner == ARGV[2] then
    rcall('DEL', key)
    rcall('ZREM', KEYS[1], id)
    removed = removed + 1
  end
end
return removed
