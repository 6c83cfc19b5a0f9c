--[[
  Deletes one widget of a subscriber, atomically, leaving a tombstone so that deleting it again
  answers "already gone" (200, data null) while an id this tenant never held (another tenant's,
  or a made-up one) stays "not found" (404, spec 2.3 rule 2).

  KEYS[1] the subscriber's widget index ({t}:sub-widgets:<externalId>, zset score 0 of widget ids)

  ARGV[1] tenant base ({t}); a widget is the hash <base>:widget:<id> (streams/keys.ts `widget`)
  ARGV[2] widget id     ARGV[3] externalId of the caller
  ARGV[4] deletedAt (ISO 8601)     ARGV[5] how long the tombstone is kept, in milliseconds

  Returns { 'deleted', field, value, ... }  the widget as it was (its hash, flattened)
          { 'gone' }                        deleted before (a tombstone of this subscriber)
          { 'missing' }                     no widget or tombstone with this id in the tenant
          { 'foreign' }                     a widget (or tombstone) of another subscriber
]]
local rcall = redis.call
local key = ARGV[1] .. ':widget:' .. ARGV[2]
local h = rcall('HGETALL', key)
if #h == 0 then return { 'missing' } end
local w = {}
for i = 1, #h, 2 do w[h[i]] = h[i + 1] end
if w.externalId ~= ARGV[3] then return { 'foreign' } end
if w.deletedAt then return { 'gone' } end
rcall('DEL', key)
rcall('ZREM', KEYS[1], ARGV[2])
rcall('HSET', key, 'id', ARGV[2], 'externalId', ARGV[3], 'deletedAt', ARGV[4])
rcall('PEXPIRE', key, ARGV[5])
return { 'deleted', unpack(h) }
