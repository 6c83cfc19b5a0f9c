--[[
  Gives up a lease if ARGV[1] still holds it: a partition's, or a lock taken with SET NX PX
  (streams/subscriber-merge.ts).

  KEYS[1] the lease key ({pN}:lease, lock:…)

  ARGV[1] owner id

  Returns 1 when released, 0 when the lease was not ARGV[1]'s.
]]
local rcall = redis.call
if rcall('GET', KEYS[1]) == ARGV[1] then
  rcall('DEL', KEYS[1])
  return 1
end
return 0
