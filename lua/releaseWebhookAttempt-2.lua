--[[
  Gives back a claimed attempt its dispatcher will not send (its endpoint was disabled between the
  claim and the send, too little of its lease is left to start it, or the process is stopping):
  while the claim token still holds the lease, the lease expires now, so the
  next claim puts the attempt back in its endpoint's queue, and a re-enable re-queues it at once
  instead of after the lease (probe A1: ~90 s). A token no longer holding the lease changes nothing.

  KEYS[1] the workspace's in-flight attempts ({w:<ws>}:whd-inflight)  zset member → lease expiry ms
  KEYS[2] the workspace's attempt leases     ({w:<ws>}:whd-leases)    hash member → claim token

  ARGV[1] member
  ARGV[2] claim token
  ARGV[3] now (ms)

  Returns 1 when the lease was given back, else 0.
]]
if redis.call('HGET', KEYS[2], ARGV[1]) ~= ARGV[2] then return 0 end
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('ZADD', KEYS[1], 'XX', tonumber(ARGV[3]), ARGV[1])
return 1
