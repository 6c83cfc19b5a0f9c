--[[
  Removes one batch of a deleted endpoint's deliveries (lua/deleteWebhookEndpoint renamed its index of
  all deliveries to its purge index): per delivery its record, its attempts in flight (their leases
  gone, a dispatcher sending one records nothing and writes no record back) and the event's payload
  unless another endpoint's delivery of the event still exists, then its purge index entry. Once the
  purge index is empty, the endpoint's per-endpoint keys are removed again (a re-queue racing the
  delete may have written its queue) and it leaves the workspace's purges. A batch is all or nothing,
  and repeating one removes nothing twice.

  The caller names, per delivery, the deliveries its event has at the workspace's other endpoints
  (their ids derive from the event and the endpoint with SHA-256, which Lua lacks), as the endpoints
  were at version ARGV[3]; if the version moved meanwhile (an endpoint created, say) nothing is done.

  KEYS[1] the endpoint's purge index         ({w:<ws>}:whk:<id>:purge)
  KEYS[2] the workspace's purges             ({w:<ws>}:whks:purge)   set of deleted endpoint ids
  KEYS[3] the endpoints' version counter     ({w:<ws>}:whks:v)

  ARGV[1] the workspace key base ({w:<ws>} with the key prefix); other names as in streams/keys.ts
  ARGV[2] endpoint id
  ARGV[3] the endpoints' version the sibling ids were computed at ('' when never set)
  ARGV[4] number of deliveries D, then per delivery: delivery id, event id ('' when its record is gone),
          number of siblings K, then K delivery ids of the event at other endpoints

  Returns { records removed, payloads removed, finished (1 when the endpoint left the purges) },
  or -1 when the version moved (nothing done).
]]
local rcall = redis.call
local base, endpointId = ARGV[1], ARGV[2]
if (rcall('GET', KEYS[3]) or '') ~= ARGV[3] then return -1 end
local inflight, leases = base .. ':whd-inflight', base .. ':whd-leases'
local batch, records, payloads = {}, 0, 0
local at = 5
for _ = 1, tonumber(ARGV[4]) do
  local deliveryId, eventId, k = ARGV[at], ARGV[at + 1], tonumber(ARGV[at + 2])
  local siblings = at + 3
  at = siblings + k
  batch[deliveryId] = true
  records = records + rcall('UNLINK', base .. ':whd:' .. deliveryId)
  if eventId ~= '' then
    local needed = false
    for i = siblings, siblings + k - 1 do
      if rcall('EXISTS', base .. ':whd:' .. ARGV[i]) == 1 then
        needed = true
        break
      end
    end
    if not needed then payloads = payloads + rcall('UNLINK', base .. ':whe:' .. eventId) end
  end
  rcall('ZREM', KEYS[1], deliveryId)
end
-- in-flight attempts (`<whd id>` or `<whd id>#<n>`) of the batch: the set holds only what dispatchers
-- have claimed and not recorded; in a workspace with no endpoint left no claim clears them
if next(batch) ~= nil then
  for _, member in ipairs(rcall('ZRANGE', inflight, 0, -1)) do
    if batch[string.match(member, '^([^#]+)')] then
      rcall('ZREM', inflight, member)
      rcall('HDEL', leases, member)
    end
  end
end
local finished = 0
if rcall('ZCARD', KEYS[1]) == 0 then
  local e = base .. ':whk:' .. endpointId
  rcall('UNLINK', e .. ':due', e .. ':dlv', e .. ':dlv:pending', e .. ':dlv:success', e .. ':dlv:failed', e .. ':dlv:exhausted')
  finished = rcall('SREM', KEYS[2], endpointId)
end
return { records, payloads, finished }
