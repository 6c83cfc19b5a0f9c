--[[
  Gives up a partition lease if ARGV[1] still holds it.

  KEYS[1] the lease key ({pN}:lease)

  ARGV[1] owner id

  Returns 1 when released, 0 when the lease was not ARGV[1]'s.
]]
local rcall = redis.call
if rcall('GET', KEYS[1]) == ARGV[1] then
  rcall('DEL', KEYS[1])
  return 1
end
return 0
