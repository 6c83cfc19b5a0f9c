--[[
  Turns ledger events into webhook deliveries, once: stores each event's payload (SET NX, so a
  re-forwarded or redelivered ledger entry keeps the first bytes) and makes one delivery per
  (event, endpoint) whose id the caller derives from both, so a second call creates nothing.
  An endpoint that no longer exists, became active after the event, or was disabled before it gets
  nothing (spec 3.3), unless the event falls in a window an edit or re-enable ended (`past`, see
  lua/updateWebhookEndpoint); one disabled after the event (`activeUntil`, set by the disable) gets its
  delivery, which waits in its queue with its retries until it is enabled again (and re-queued).
  Up to the caller's free capacity per enabled endpoint the first attempts are claimed at once
  (leased to the caller, as claimWebhookAttempts does); the others wait in the endpoint's queue.
  A new delivery's score in the endpoint's delivery indexes (all, and `pending`) is its createdAt
  (now) in ms × the score per ms, plus n for the n-th delivery the endpoint got in that millisecond
  (ledger order within a call, call order across calls; the last slot is shared past it), so the
  lists are newest first by createdAt, ties in arrival order (streams/scored-index.ts).

  KEYS[1] the workspace's in-flight attempts ({w:<ws>}:whd-inflight)  zset member → lease expiry ms
  KEYS[2] the workspace's attempt leases     ({w:<ws>}:whd-leases)    hash member → claim token

  ARGV[1] the workspace key base ({w:<ws>} with the key prefix); other names as in streams/keys.ts
  ARGV[2] now (ms)
  ARGV[3] now (ISO 8601)
  ARGV[4] retention (ms): how long payloads and delivery records are kept
  ARGV[5] lease (ms)
  ARGV[6] claim token (unique per call; each claim gets `<token>:<n>`)
  ARGV[7] index score per ms (1000)
  ARGV[8] number of endpoints C with capacity, then C pairs: endpoint id, attempts it may still take
  then the number of events E, then per event: event id, event time (ms), event type, payload JSON,
       number of endpoints K, then K pairs: endpoint id, delivery id

  Returns { claimed, existing }:
    claimed:  one { member, token, endpoint id, delivery id, event id, attempt number } per claimed attempt
    existing: event id, stored payload, … for each event whose payload was already stored
]]
local rcall = redis.call
local base, nowMs, nowIso, retention, lease, token = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4], tonumber(ARGV[5]), ARGV[6]
local perMs = tonumber(ARGV[7])
local capacity = {}
local c = tonumber(ARGV[8])
local at = 9
for _ = 1, c do
  capacity[ARGV[at]] = tonumber(ARGV[at + 1])
  at = at + 2
end
local endpoints = {}
local function endpoint(id)
  local e = endpoints[id]
  if e == nil then
    local h = rcall('HMGET', base .. ':whk:' .. id, 'enabled', 'activeSince', 'activeUntil', 'past')
    e = { enabled = h[1] == '1', activeSince = tonumber(h[2] or '0') or 0, activeUntil = tonumber(h[3] or '0') or 0,
      past = (h[4] and h[4] ~= '') and cjson.decode(h[4]) or {} }
    endpoints[id] = e
  end
  return e
end

-- whether the endpoint was active at `ms`: its current window, or one an edit or re-enable ended
-- (`past`; the caller matched the event against that window's patterns and tenant)
local function activeAt(e, ms)
  if ms >= e.activeSince and (e.enabled or ms < e.activeUntil) then return true end
  for _, w in ipairs(e.past) do
    if ms >= w.since and ms < w['until'] then return true end
  end
  return false
end

-- the next free score of this millisecond in an endpoint's delivery index, then one more per delivery
local first, last = nowMs * perMs, nowMs * perMs + perMs - 1
local nextScore = {}
local function score(idx)
  local s = nextScore[idx]
  if s == nil then
    local top = rcall('ZRANGE', idx, string.format('%.0f', last), string.format('%.0f', first), 'BYSCORE', 'REV', 'LIMIT', 0, 1, 'WITHSCORES')
    s = top[2] and tonumber(top[2]) + 1 or first
  end
  nextScore[idx] = s + 1
  return string.format('%.0f', math.min(s, last))
end

local claimed, existing, n = {}, {}, 0
local events = tonumber(ARGV[at])
at = at + 1
for _ = 1, events do
  local eventId, eventMs, eventType, body, k = ARGV[at], tonumber(ARGV[at + 1]), ARGV[at + 2], ARGV[at + 3], tonumber(ARGV[at + 4])
  at = at + 5
  local payloadKey = base .. ':whe:' .. eventId
  local stored = false
  for _ = 1, k do
    local endpointId, deliveryId = ARGV[at], ARGV[at + 1]
    at = at + 2
    local e = endpoint(endpointId)
    local d = base .. ':whd:' .. deliveryId
    if activeAt(e, eventMs) and rcall('EXISTS', d) == 0 then
      if not stored then
        stored = true
        if not rcall('SET', payloadKey, body, 'NX', 'PX', retention) then
          existing[#existing + 1] = eventId
          existing[#existing + 1] = rcall('GET', payloadKey)
        end
      end
      rcall('HSET', d, 'id', deliveryId, 'endpointId', endpointId, 'eventId', eventId, 'eventType', eventType,
        'status', 'pending', 'attempts', 0, 'replays', 0, 'n', 0, 'createdAt', nowIso, 'updatedAt', nowIso,
        'nextAttemptAt', nowMs, 'lastAttemptAt', '', 'lastStatusCode', '')
      rcall('PEXPIRE', d, retention)
      local idx = base .. ':whk:' .. endpointId .. ':dlv'
      local s = score(idx)
      rcall('ZADD', idx, s, deliveryId)
      rcall('ZADD', idx .. ':pending', s, deliveryId)
      local free = e.enabled and capacity[endpointId] or 0
      if free > 0 then
        capacity[endpointId] = free - 1
        n = n + 1
        local claim = token .. ':' .. n
        rcall('ZADD', KEYS[1], nowMs + lease, deliveryId)
        rcall('HSET', KEYS[2], deliveryId, claim)
        claimed[#claimed + 1] = { deliveryId, claim, endpointId, deliveryId, eventId, 1 }
      else
        rcall('ZADD', base .. ':whk:' .. endpointId .. ':due', nowMs, deliveryId)
      end
    end
  end
end
return { claimed, existing }
