--[[
  Registers a widget of a subscriber, idempotently and within the per-subscriber limit, atomically:
  a widget whose push token equals the request's is updated in place; without a push token, a
  widget without one and with the same kind, family and configuration (canonical JSON) is the same
  widget; otherwise a new widget is stored, unless the subscriber holds the maximum already. The
  widget answered is tagged with the subscriber's sub_ id (`subscriber`), so the cleanup of a deleted
  subscriber of the same externalId (lua/deleteWidgets) leaves it alone.

  KEYS[1] the subscriber's widget index ({t}:sub-widgets:<externalId>, zset score 0 of widget ids)

  ARGV[1] tenant base ({t}); a widget is the hash <base>:widget:<id> (streams/keys.ts `widget`)
  ARGV[2] widget id to use when the widget is new
  ARGV[3] externalId
  ARGV[4] kind     ARGV[5] family ('' for none)     ARGV[6] push token ('' for none)
  ARGV[7] configuration (canonical JSON)            ARGV[8] createdAt (ISO 8601)
  ARGV[9] widgets a subscriber holds at most
  ARGV[10] the subscriber's sub_ id

  Returns { 'created', field, value, ... }  a new widget (its hash, flattened)
          { 'updated', field, value, ... }  the widget with this push token, kind/family/configuration updated
          { 'same', field, value, ... }     the widget with this kind, family and configuration, unchanged
          { 'full' }                        the subscriber holds the maximum already (nothing written)
]]
local rcall = redis.call
local base, token = ARGV[1], ARGV[6]
for _, id in ipairs(rcall('ZRANGE', KEYS[1], 0, -1)) do
  local key = base .. ':widget:' .. id
  local w = rcall('HMGET', key, 'kind', 'family', 'pushToken', 'configuration')
  if w[1] then
    if token ~= '' and w[3] == token then
      rcall('HSET', key, 'kind', ARGV[4], 'family', ARGV[5], 'configuration', ARGV[7], 'subscriber', ARGV[10])
      return { 'updated', unpack(rcall('HGETALL', key)) }
    end
    if token == '' and (w[3] or '') == '' and w[1] == ARGV[4] and (w[2] or '') == ARGV[5] and w[4] == ARGV[7] then
      rcall('HSET', key, 'subscriber', ARGV[10])
      return { 'same', unpack(rcall('HGETALL', key)) }
    end
  end
end
if rcall('ZCARD', KEYS[1]) >= tonumber(ARGV[9]) then return { 'full' } end
local key = base .. ':widget:' .. ARGV[2]
rcall('HSET', key, 'id', ARGV[2], 'externalId', ARGV[3], 'kind', ARGV[4], 'family', ARGV[5], 'pushToken', token, 'configuration', ARGV[7], 'createdAt', ARGV[8], 'subscriber', ARGV[10])
rcall('ZADD', KEYS[1], 0, ARGV[2])
return { 'created', unpack(rcall('HGETALL', key)) }
