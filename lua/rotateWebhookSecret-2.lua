--[[
  Rotates a webhook endpoint's signing secret (spec 6.2.8): the current one is retired, and keeps
  signing and verifying for 24 hours from this rotation; the new one is current.

  Retired secrets live in `retiredSecrets`, a JSON list `[{ secret, expiresAt (ms) }]`, newest
  first. Records rotated by an earlier version hold one retired secret as `previousSecret`, retired
  at `rotatedAt`: it joins the list here (unless already there). Expired ones are dropped, and at
  most ARGV[5] are kept: beyond that the oldest ends early. `previousSecret` keeps naming the newest
  retired secret and `rotatedAt` the last rotation, which processes of the earlier version read
  during a rolling upgrade (and `secretRotatedAt` shows).

  KEYS[1] the endpoint record              ({w:<ws>}:whk:<id>)
  KEYS[2] the endpoints' version counter   ({w:<ws>}:whks:v)

  ARGV[1] the new secret (whsec_…)
  ARGV[2] now (ms)
  ARGV[3] now (ISO 8601)
  ARGV[4] how long a retired secret keeps signing (ms)
  ARGV[5] most retired secrets kept

  Returns {} when the endpoint does not exist, else { before, after } as HGETALL lists.
]]
local rcall = redis.call
if rcall('EXISTS', KEYS[1]) == 0 then return {} end
local nowMs, validity, most = tonumber(ARGV[2]), tonumber(ARGV[4]), tonumber(ARGV[5])
local before = rcall('HGETALL', KEYS[1])
local h = rcall('HMGET', KEYS[1], 'secret', 'retiredSecrets', 'previousSecret', 'rotatedAt')
local old = h[1]

-- `at` is the stored position: rotations within one millisecond retire secrets with equal expiresAt,
-- and table.sort is not stable, so the stored (newest first) order breaks the tie
local live, seen = {}, { [old] = true }
local function keep(secret, expiresAt)
  if secret and secret ~= '' and expiresAt and expiresAt > nowMs and not seen[secret] then
    seen[secret] = true
    live[#live + 1] = { secret = secret, expiresAt = expiresAt, at = #live }
  end
end
if h[2] and h[2] ~= '' then
  for _, r in ipairs(cjson.decode(h[2])) do keep(r.secret, tonumber(r.expiresAt)) end
end
if h[3] and h[3] ~= '' and h[4] and h[4] ~= '' then keep(h[3], tonumber(h[4]) + validity) end
table.sort(live, function(a, b)
  if a.expiresAt ~= b.expiresAt then return a.expiresAt > b.expiresAt end
  return a.at < b.at
end)

local retired = { { secret = old, expiresAt = nowMs + validity } }
for i = 1, math.min(#live, most - 1) do retired[#retired + 1] = { secret = live[i].secret, expiresAt = live[i].expiresAt } end

rcall('HSET', KEYS[1], 'retiredSecrets', cjson.encode(retired), 'previousSecret', old, 'rotatedAt', ARGV[2],
  'secret', ARGV[1], 'updatedAt', ARGV[3])
rcall('INCR', KEYS[2])
return { before, rcall('HGETALL', KEYS[1]) }
