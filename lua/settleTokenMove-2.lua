--[[
  Settles a token's move once the previous subscriber's copy is removed: forgets the unsettled move,
  only while it is still the move the caller finished (the same previous subscriber, and the token
  still names the mover's subscription). A later claim by a third subscriber records a move of its
  own in the same field, which stays for its mover (or the sweeper) to finish.

  KEYS[1] token index          ({t}:tokens)       field channel:handle -> subscriptionId|externalId
  KEYS[2] unsettled moves      ({t}:token-moves)  field channel:handle -> previous externalId

  ARGV[1] token field (push:<token>, or email:<length of externalId>:<externalId>:<address>)
  ARGV[2] previous externalId whose copy was removed
  ARGV[3] subscriptionId|externalId of the mover

  Returns 1 when the move was forgotten, 0 when it is not the caller's move any more (nothing changed).
]]
local rcall = redis.call
if rcall('HGET', KEYS[2], ARGV[1]) ~= ARGV[2] then return 0 end
if rcall('HGET', KEYS[1], ARGV[1]) ~= ARGV[3] then return 0 end
rcall('HDEL', KEYS[2], ARGV[1])
return 1
