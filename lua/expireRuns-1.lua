--[[
  Expires a partition's workflow runs that ended (completed, canceled, failed) before the cutoff,
  oldest end first: the run record goes with its entries in the workflow's run indexes. A run still
  active (which an ended run never becomes again) only leaves the list. Idempotent: a call cut short
  is finished by the next sweep.

  KEYS[1] the partition's ended runs ({pN}:runs-ended: `<tenantId>|<runId>` → end ms)

  ARGV[1] partition key base ({pN} with the key prefix): run records and indexes are built from it
          as streams/keys.ts builds them
  ARGV[2] cutoff (ms): runs that ended at or before it expire
  ARGV[3] at most this many runs by this call

  Returns the number of runs expired.
]]
local rcall = redis.call
local base = ARGV[1]
local ended = rcall('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[2], 'LIMIT', 0, tonumber(ARGV[3]))
local expired = 0
for _, member in ipairs(ended) do
  local bar = string.find(member, '|', 1, true)
  local tenant, runId = string.sub(member, 1, bar - 1), string.sub(member, bar + 1)
  local record = base .. ':run:' .. tenant .. ':' .. runId
  local h = rcall('HMGET', record, 'workflowId', 'status')
  local workflowId, status = h[1], h[2]
  if not (status == 'running' or status == 'sleeping' or status == 'waiting') then
    if workflowId then
      local runs = base .. ':wfr:' .. tenant .. ':' .. workflowId
      rcall('ZREM', runs, runId)
      if status then rcall('ZREM', runs .. ':' .. status, runId) end
    end
    rcall('DEL', record)
    expired = expired + 1
  end
  rcall('ZREM', KEYS[1], member)
end
return expired
