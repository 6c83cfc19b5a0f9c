--[[
  Takes back the mark lua/markMovedOut set for a move whose registration was then refused (its claim
  given back, lua/unclaimToken): only while the mark is still that claim's (a later move's stays).

  KEYS[1] the marks of the subscription in the subscriber's partition ({pN}:scr-out:<tenant>:<subscriptionId>)

  ARGV[1] externalId, ARGV[2] the refused move's claim number

  Returns 1 when the mark was taken back, else 0.
]]
local rcall = redis.call
if rcall('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
rcall('HDEL', KEYS[1], ARGV[1])
return 1
