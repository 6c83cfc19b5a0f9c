--[[
  Decides who owns a push token or an email address in a tenant, atomically, so concurrent
  registrations of one token end with one subscription.

  KEYS[1] token index          ({t}:tokens)       field channel:handle -> subscriptionId|externalId
  KEYS[2] subscription owners  ({t}:scr-owner)    field subscriptionId -> externalId
  KEYS[3] unsettled moves      ({t}:token-moves)  field channel:handle -> previous externalId

  ARGV[1] token field (push:<token> or email:<address>)
  ARGV[2] subscription id to use when the token is new
  ARGV[3] externalId registering it

  Returns { 'new', id }                       the token was unknown: it is now the caller's
          { 'same', id }                      it already belongs to this externalId
          { 'moved', id, previousExternalId } it belonged to another subscriber (or its move from one is
                                              not settled yet): it is the caller's now; the caller removes
                                              it from the previous subscriber, then settles the move
]]
local rcall = redis.call
local current = rcall('HGET', KEYS[1], ARGV[1])
if not current then
  rcall('HSET', KEYS[1], ARGV[1], ARGV[2] .. '|' .. ARGV[3])
  rcall('HSET', KEYS[2], ARGV[2], ARGV[3])
  return { 'new', ARGV[2] }
end
local bar = string.find(current, '|', 1, true)
local id, owner = string.sub(current, 1, bar - 1), string.sub(current, bar + 1)
if owner == ARGV[3] then
  local pending = rcall('HGET', KEYS[3], ARGV[1])
  if pending then return { 'moved', id, pending } end
  return { 'same', id }
end
rcall('HSET', KEYS[1], ARGV[1], id .. '|' .. ARGV[3])
rcall('HSET', KEYS[2], id, ARGV[3])
rcall('HSET', KEYS[3], ARGV[1], owner)
return { 'moved', id, owner }
