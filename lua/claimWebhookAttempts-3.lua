--[[
  Claims the due attempts of a workspace's enabled endpoints, up to the caller's free capacity per
  endpoint, each leased to the caller until `now + lease`. First, attempts whose lease expired (a
  dispatcher died mid-attempt) go back to their endpoint's queue, due now. A disabled endpoint's
  attempts stay queued (spec: they wait, and are not consumed); members whose delivery is gone or
  already finished are dropped.

  KEYS[1] the workspace's endpoint index     ({w:<ws>}:whks)
  KEYS[2] the workspace's in-flight attempts ({w:<ws>}:whd-inflight)  zset member → lease expiry ms
  KEYS[3] the workspace's attempt leases     ({w:<ws>}:whd-leases)    hash member → claim token

  ARGV[1] the workspace key base ({w:<ws>} with the key prefix); other names as in streams/keys.ts
  ARGV[2] now (ms)
  ARGV[3] lease (ms)
  ARGV[4] claim token (unique per call; each claim gets `<token>:<n>`)
  ARGV[5] capacity of endpoints not listed below
  ARGV[6] number of endpoints C listed, then C pairs: endpoint id, attempts it may still take

  Returns { next, endpoints }: next is the earliest time (ms) something of the workspace becomes due
  (a queued attempt of an enabled endpoint, or a lease expiry), -1 when nothing is waiting;
  endpoints holds one item per endpoint with attempts claimed or still due:
    { endpoint id, due left, attempts }
    (not its URL or secrets: the dispatcher reads the endpoint as it is when each attempt starts)
    where attempts holds { member, token, delivery id, event id, attempt number (0 for a replay), payload }
]]
local rcall = redis.call
local base, nowMs, lease, token, default = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4], tonumber(ARGV[5])
local capacity = {}
for i = 0, tonumber(ARGV[6]) - 1 do capacity[ARGV[7 + 2 * i]] = tonumber(ARGV[8 + 2 * i]) end

-- expired leases: back to the queue of their endpoint (if it still exists)
for _, member in ipairs(rcall('ZRANGEBYSCORE', KEYS[2], '-inf', nowMs, 'LIMIT', 0, 500)) do
  rcall('ZREM', KEYS[2], member)
  rcall('HDEL', KEYS[3], member)
  local deliveryId = string.match(member, '^([^#]+)')
  local endpointId = rcall('HGET', base .. ':whd:' .. deliveryId, 'endpointId')
  if endpointId and rcall('EXISTS', base .. ':whk:' .. endpointId) == 1 then
    rcall('ZADD', base .. ':whk:' .. endpointId .. ':due', nowMs, member)
  end
end

local out, n, nextAt = {}, 0, -1
for _, endpointId in ipairs(rcall('ZRANGE', KEYS[1], 0, -1)) do
  local free = capacity[endpointId] or default
  local e = base .. ':whk:' .. endpointId
  if rcall('HGET', e, 'enabled') == '1' then
    local due = e .. ':due'
    local attempts = {}
    if free > 0 then
      for _, member in ipairs(rcall('ZRANGEBYSCORE', due, '-inf', nowMs, 'LIMIT', 0, free)) do
        rcall('ZREM', due, member)
        local deliveryId, replay = string.match(member, '^([^#]+)#?(%d*)$')
        local d = rcall('HMGET', base .. ':whd:' .. deliveryId, 'status', 'eventId', 'attempts')
        local body = d[2] and rcall('GET', base .. ':whe:' .. d[2])
        local live = d[1] and body and (replay ~= '' or d[1] == 'pending' or d[1] == 'failed')
        if live then
          n = n + 1
          local claim = token .. ':' .. n
          rcall('ZADD', KEYS[2], nowMs + lease, member)
          rcall('HSET', KEYS[3], member, claim)
          attempts[#attempts + 1] = { member, claim, deliveryId, d[2], replay ~= '' and 0 or tonumber(d[3]) + 1, body }
        end
      end
    end
    local left = rcall('ZCOUNT', due, '-inf', nowMs)
    if #attempts > 0 or left > 0 then
      out[#out + 1] = { endpointId, left, attempts }
    end
    local first = rcall('ZRANGE', due, 0, 0, 'WITHSCORES')[2]
    if first and (nextAt < 0 or tonumber(first) < nextAt) then nextAt = tonumber(first) end
  end
end
local lease = rcall('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')[2]
if lease and (nextAt < 0 or tonumber(lease) < nextAt) then nextAt = tonumber(lease) end
return { nextAt, out }
