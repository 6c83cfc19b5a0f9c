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
  ARGV[5] for an email address, its field from before addresses were one per subscriber (email:<address>;
          '' or absent otherwise): released too when it is the subscription's. One call for both fields, so
          the owner and claim number go once, with the fence above (a second call after the first had
          dropped them was unfenced: a registration between the two took the former field over and was left
          with no owner entry, its subscription unreachable by id and skipped by fan-outs; probe DV)

  Returns 1 when a token entry was removed, 0 otherwise. Nothing is released when the subscription
  was claimed after the removed record was written (a registration of the same subscriber whose write
  lands after the removal: it writes the record anew, and the token stays its).
]]
local rcall = redis.call
if ARGV[4] and ARGV[4] ~= '' and tonumber(rcall('HGET', KEYS[4], ARGV[2]) or '0') > tonumber(ARGV[4]) then return 0 end
if rcall('HGET', KEYS[2], ARGV[2]) == ARGV[3] then
  rcall('HDEL', KEYS[2], ARGV[2])
  rcall('HDEL', KEYS[4], ARGV[2])
end
local released = 0
for _, field in ipairs({ ARGV[1], ARGV[5] or '' }) do
  if field ~= '' and rcall('HGET', KEYS[1], field) == ARGV[2] .. '|' .. ARGV[3] then
    rcall('HDEL', KEYS[1], field)
    rcall('HDEL', KEYS[3], field)
    released = 1
  end
end
return released
