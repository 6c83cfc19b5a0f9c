--[[
  Re-queues deliveries of a re-enabled endpoint (spec 3.3): each one still `pending` or `failed`
  and not being sent right now becomes due now. Called in pages of ids by streams/webhook-deliveries.

  KEYS[1] the workspace's in-flight attempts ({w:<ws>}:whd-inflight)
  KEYS[2] the endpoint's attempt queue       ({w:<ws>}:whk:<endpoint id>:due)

  ARGV[1] the workspace key base ({w:<ws>} with the key prefix)
  ARGV[2] now (ms)
  ARGV[3..] delivery ids

  Returns how many were queued.
]]
local rcall = redis.call
local queued = 0
for i = 3, #ARGV do
  local id = ARGV[i]
  local status = rcall('HGET', ARGV[1] .. ':whd:' .. id, 'status')
  if (status == 'pending' or status == 'failed') and not rcall('ZSCORE', KEYS[1], id) then
    rcall('ZADD', KEYS[2], ARGV[2], id)
    rcall('HSET', ARGV[1] .. ':whd:' .. id, 'nextAttemptAt', ARGV[2])
    queued = queued + 1
  end
end
return queued
