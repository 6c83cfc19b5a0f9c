--[[
  Forgets the token of a removed subscription, if it still belongs to that subscription and to the
  subscriber it was removed from (a token another subscriber claimed meanwhile stays theirs).

  KEYS[1] token index          ({t}:tokens)
  KEYS[2] subscription owners  ({t}:scr-owner)
  KEYS[3] unsettled moves      ({t}:token-moves)
  KEYS[4] claim numbers        ({t}:scr-claims)

  ARGV[1] token field (push:<token>, or email:<length of externalId>:<externalId>:<address>), or '' when unknown
  ARGV[2] subscription id
  ARGV[3] externalId the subscription was removed from
  ARGV[4] claim number stamped on the record that was removed ('' for none known)

  Returns 1 when the token entry was removed, 0 otherwise. Nothing is released when the subscription
  was claimed after the removed record was written (a registration of the same subscriber whose write
  lands after the removal: it writes the record anew, and the token stays its).
]]
local rcall = redis.call
if ARGV[4] and ARGV[4] ~= '' and tonumber(rcall('HGET', KEYS[4], ARGV[2]) or '0') > tonumber(ARGV[4]) then return 0 end
if rcall('HGET', KEYS[2], ARGV[2]) == ARGV[3] then
  rcall('HDEL', KEYS[2], ARGV[2])
  rcall('HDEL', KEYS[4], ARGV[2])
end
if ARGV[1] == '' then return 0 end
if rcall('HGET', KEYS[1], ARGV[1]) == ARGV[2] .. '|' .. ARGV[3] then
  rcall('HDEL', KEYS[1], ARGV[1])
  rcall('HDEL', KEYS[3], ARGV[1])
  return 1
end
return 0
