--[[
  Forgets a token of a removed subscription, if it still belongs to that subscription.

  KEYS[1] token index          ({t}:tokens)
  KEYS[2] subscription owners  ({t}:scr-owner)
  KEYS[3] unsettled moves      ({t}:token-moves)

  ARGV[1] token field (push:<token> or email:<address>), or '' when unknown
  ARGV[2] subscription id

  Returns 1 when the token entry was removed, 0 otherwise.
]]
local rcall = redis.call
rcall('HDEL', KEYS[2], ARGV[2])
if ARGV[1] == '' then return 0 end
local current = rcall('HGET', KEYS[1], ARGV[1])
if current and string.sub(current, 1, #ARGV[2] + 1) == ARGV[2] .. '|' then
  rcall('HDEL', KEYS[1], ARGV[1])
  rcall('HDEL', KEYS[3], ARGV[1])
  return 1
end
return 0
