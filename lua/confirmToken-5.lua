--[[
  After a registration wrote its record: does the token still name that record? A removal of the
  same subscription (whose record another claim of this subscriber had written meanwhile) may have
  forgotten the token between this registration's claim and its write; the record written after
  it would then be one the token index does not name, and the next registration of the device
  would make a second subscription. Such a token is given back to the record ('reinstated').

  KEYS[1] token index          ({t}:tokens)
  KEYS[2] subscription owners  ({t}:scr-owner)
  KEYS[3] unsettled moves      ({t}:token-moves)
  KEYS[4] claim numbers        ({t}:scr-claims)
  KEYS[5] the token's registration lock ({t}:token-lock:<channel:handle>, lua/claimToken)

  ARGV[1] token field (push:<token>, or email:<length of externalId>:<externalId>:<address>)
  ARGV[2] subscription id written
  ARGV[3] externalId that wrote it
  ARGV[4] the claim number stamped on the record
  ARGV[5] the registration's lock owner: the lock is given up when it still holds it ('' for none)

  Returns 'held' (the token names this record), 'reinstated' (it was forgotten: it names this record
  again, with this claim number unless a later one is known), or 'lost' (it names another record or
  another subscriber: the caller removes its own copy).
]]
local rcall = redis.call
if ARGV[5] ~= '' and rcall('GET', KEYS[5]) == ARGV[5] then rcall('DEL', KEYS[5]) end
local mine = ARGV[2] .. '|' .. ARGV[3]
local current = rcall('HGET', KEYS[1], ARGV[1])
if current == mine then return 'held' end
if current then return 'lost' end
rcall('HSET', KEYS[1], ARGV[1], mine)
rcall('HSET', KEYS[2], ARGV[2], ARGV[3])
if tonumber(rcall('HGET', KEYS[4], ARGV[2]) or '0') < tonumber(ARGV[4]) then rcall('HSET', KEYS[4], ARGV[2], ARGV[4]) end
return 'reinstated'
