--[[
  Re-queues deliveries of a re-enabled endpoint (spec 3.3): each one still `pending` or `failed`
  and not being sent right now becomes due at the re-enable. Called in pages of ids by
  streams/webhook-deliveries.ts requeueOwed, then once more with `last` and no ids to clear the
  note the re-enable left (only when it still holds this re-enable's time: a later re-enable's
  note stays for its own re-queue). An endpoint deleted meanwhile gets nothing (its queue would
  outlive it) and its note goes.

  KEYS[1] the workspace's in-flight attempts ({w:<ws>}:whd-inflight)
  KEYS[2] the endpoint's attempt queue       ({w:<ws>}:whk:<endpoint id>:due)
  KEYS[3] the re-queues owed                 ({w:<ws>}:whks:requeue)

  ARGV[1] the workspace key base ({w:<ws>} with the key prefix)
  ARGV[2] the re-enable's time (ms): the due time, and the note's value
  ARGV[3] endpoint id
  ARGV[4] '1' on the last call: clear the note
  ARGV[5..] delivery ids

  Returns how many were queued, or -1 when the endpoint does not exist.
]]
local rcall = redis.call
if rcall('EXISTS', ARGV[1] .. ':whk:' .. ARGV[3]) == 0 then
  rcall('HDEL', KEYS[3], ARGV[3])
  return -1
end
local queued = 0
for i = 5, #ARGV do
  local id = ARGV[i]
  local status = rcall('HGET', ARGV[1] .. ':whd:' .. id, 'status')
  if (status == 'pending' or status == 'failed') and not rcall('ZSCORE', KEYS[1], id) then
    rcall('ZADD', KEYS[2], ARGV[2], id)
    rcall('HSET', ARGV[1] .. ':whd:' .. id, 'nextAttemptAt', ARGV[2])
    queued = queued + 1
  end
end
if ARGV[4] == '1' and rcall('HGET', KEYS[3], ARGV[3]) == ARGV[2] then rcall('HDEL', KEYS[3], ARGV[3]) end
return queued
