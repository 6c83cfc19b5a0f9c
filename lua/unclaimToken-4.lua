--[[
  Gives back a token claimed by a registration that was then refused (the subscriber already holds
  its maximum of subscriptions), so the refused call changes nothing: a token it took from another
  subscriber returns to that subscriber (whose copy was never removed: a move removes it only after
  the new owner's write), and one it claimed as new is forgotten. Only while the claim still stands:
  a later claim by someone else is left alone. A moved token's claim number stays (numbers only
  ever grow); a new one's goes with its never-used subscription id.

  KEYS[1] token index          ({t}:tokens)       field channel:handle -> subscriptionId|externalId
  KEYS[2] subscription owners  ({t}:scr-owner)    field subscriptionId -> externalId
  KEYS[3] unsettled moves      ({t}:token-moves)  field channel:handle -> previous externalId
  KEYS[4] claim numbers        ({t}:scr-claims)   field subscriptionId -> number of its latest claim

  ARGV[1] token field (push:<token>, or email:<length of externalId>:<externalId>:<address>)
  ARGV[2] subscription id the claim answered
  ARGV[3] externalId whose registration was refused
  ARGV[4] externalId the token was moved from ('' when it was claimed as new)
  ARGV[5] the unsettled move the claim replaced (lua/claimToken's `unsettledFrom`), '' for none: it is recorded again

  Returns 1 when the claim was given back, 0 when it no longer stood (nothing changed).
]]
local rcall = redis.call
if rcall('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] .. '|' .. ARGV[3] then return 0 end
if ARGV[4] ~= '' then
  rcall('HSET', KEYS[1], ARGV[1], ARGV[2] .. '|' .. ARGV[4])
  rcall('HSET', KEYS[2], ARGV[2], ARGV[4])
else
  rcall('HDEL', KEYS[1], ARGV[1])
  rcall('HDEL', KEYS[2], ARGV[2])
  rcall('HDEL', KEYS[4], ARGV[2])
end
if ARGV[5] ~= nil and ARGV[5] ~= '' then rcall('HSET', KEYS[3], ARGV[1], ARGV[5]) else rcall('HDEL', KEYS[3], ARGV[1]) end
return 1
