--[[
  Takes or renews a partition lease.

  KEYS[1] the lease key ({pN}:lease)

  ARGV[1] owner id (worker id)
  ARGV[2] lease length (ms)

  Returns 1 when ARGV[1] holds the lease afterwards (taken free, or renewed), 0 when another owner does.
]]
local rcall = redis.call
local owner = rcall('GET', KEYS[1])
if owner == false then
  rcall('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
if owner == ARGV[1] then
  rcall('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
