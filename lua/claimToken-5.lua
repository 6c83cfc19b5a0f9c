--[[
  Decides who owns a push token or an email address in a tenant, atomically, so concurrent
  registrations of one token end with one subscription. Every claim that gives the token an owner
  (or confirms its owner) gets the next claim number of its subscription; the claimer stamps it on the record it writes,
  and removing a copy is fenced by it (a move removes the previous subscriber's copy only when that
  copy's stamp is not newer than the move's claim), so a move never removes the copy of a later
  claim by the previous subscriber.

  KEYS[1] token index          ({t}:tokens)       field channel:handle -> subscriptionId|externalId
  KEYS[2] subscription owners  ({t}:scr-owner)    field subscriptionId -> externalId
  KEYS[3] unsettled moves      ({t}:token-moves)  field channel:handle -> previous externalId
  KEYS[4] claim numbers        ({t}:scr-claims)   field subscriptionId -> number of its latest claim
  KEYS[5] the token's registration lock ({t}:token-lock:<channel:handle>)

  ARGV[1] token field (push:<token>, or email:<length of externalId>:<externalId>:<address>)
  ARGV[2] subscription id to use when the token is new
  ARGV[3] externalId registering it
  ARGV[4] the registration's lock owner ('' to take no lock), ARGV[5] how long the lock holds (ms)
  ARGV[6] for an email address, its field from before addresses were one per subscriber
          (email:<address>; '' or absent otherwise): when ARGV[1] is unknown and that field is the
          caller's, it becomes ARGV[1] (the same subscription, not a second one), with its unsettled move

  One registration of a token at a time (from its claim to its check after the write,
  lua/confirmToken, which gives the lock up): a claim taken while another registration holds the
  lock answers { 'busy' } and changes nothing; the caller waits and claims again. A lock that
  expires (its holder died or stalled) lets the next go on; the claim numbers keep that one right.

  Returns { 'new', id, claim }                       the token was unknown: it is now the caller's
          { 'same', id, claim }                      it already belongs to this externalId
          { 'moved', id, claim, previousExternalId[, unsettledFrom] }
                                                     it belonged to another subscriber (or its move from one is
                                                     not settled yet): it is the caller's now; the caller writes
                                                     its record, removes the previous subscriber's copy, then
                                                     settles the move. `unsettledFrom`: the previous subscriber's
                                                     own move from that one was not settled (its mover was
                                                     killed, or is still at work), and this claim records its
                                                     own in its place: that one's copy may still be there, so
                                                     the caller takes it over (when the previous subscriber
                                                     wrote none) and removes it too (probe CA: a third user's
                                                     registration after a mover was killed left the first user
                                                     a copy nobody would remove)
]]
local rcall = redis.call
if ARGV[4] ~= '' and not rcall('SET', KEYS[5], ARGV[4], 'PX', ARGV[5], 'NX') then return { 'busy' } end
local current = rcall('HGET', KEYS[1], ARGV[1])
if not current and ARGV[6] and ARGV[6] ~= '' then
  local legacy = rcall('HGET', KEYS[1], ARGV[6])
  if legacy and string.sub(legacy, string.find(legacy, '|', 1, true) + 1) == ARGV[3] then
    rcall('HSET', KEYS[1], ARGV[1], legacy)
    rcall('HDEL', KEYS[1], ARGV[6])
    -- and its owner entry, which a removal racing this registration may have dropped (probe DV)
    rcall('HSET', KEYS[2], string.sub(legacy, 1, string.find(legacy, '|', 1, true) - 1), ARGV[3])
    -- a move of it left unsettled goes with it, to be settled as any (its previous holder's copy removed)
    local pending = rcall('HGET', KEYS[3], ARGV[6])
    if pending then
      rcall('HSET', KEYS[3], ARGV[1], pending)
      rcall('HDEL', KEYS[3], ARGV[6])
    end
    current = legacy
  end
end
if not current then
  rcall('HSET', KEYS[1], ARGV[1], ARGV[2] .. '|' .. ARGV[3])
  rcall('HSET', KEYS[2], ARGV[2], ARGV[3])
  return { 'new', ARGV[2], rcall('HINCRBY', KEYS[4], ARGV[2], 1) }
end
local bar = string.find(current, '|', 1, true)
local id, owner = string.sub(current, 1, bar - 1), string.sub(current, bar + 1)
if owner == ARGV[3] then
  -- a claim of its own token gets a number too: a removal that read the record before this claim's
  -- write does not release the token under it (lua/releaseToken). So does one that finishes an
  -- unsettled move of it: with the move's number kept, a removal of the same subscription racing
  -- it (live, or finished late by the sweeper) passed the fence and forgot the entry the claim had
  -- just confirmed (probes EA, ED: the next registration made a second subscription)
  local claim = rcall('HINCRBY', KEYS[4], id, 1)
  local pending = rcall('HGET', KEYS[3], ARGV[1])
  if pending then return { 'moved', id, claim, pending } end
  return { 'same', id, claim }
end
rcall('HSET', KEYS[1], ARGV[1], id .. '|' .. ARGV[3])
rcall('HSET', KEYS[2], id, ARGV[3])
local unsettled = rcall('HGET', KEYS[3], ARGV[1])
rcall('HSET', KEYS[3], ARGV[1], owner)
if unsettled and unsettled ~= ARGV[3] and unsettled ~= owner then
  return { 'moved', id, rcall('HINCRBY', KEYS[4], id, 1), owner, unsettled }
end
return { 'moved', id, rcall('HINCRBY', KEYS[4], id, 1), owner }
