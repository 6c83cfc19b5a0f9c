-- Makes `newSecret` a record's current secret and retires the one it replaces, which keeps verifying
-- (and, for a webhook endpoint, signing) for `validity` ms from now (spec 6.2.8). Fields of the hash
-- `key`: `secret`, `retiredSecrets` (a JSON list `[{ secret, expiresAt (ms) }]`, newest first),
-- `previousSecret` (the newest retired secret) and `rotatedAt` (ms of the last change). Records
-- rotated by an earlier version hold one retired secret as `previousSecret`, retired at `rotatedAt`:
-- it joins the list here (unless already there). Expired ones are dropped, and at most `most` are
-- kept: beyond that the oldest ends early. lib/webhook-signing.ts `retiredSecretsOf` reads them.
-- `now` is the time in ms as text (stored as it is in `rotatedAt`).
local function retireSecret(key, newSecret, now, validity, most)
  local nowMs = tonumber(now)
  local h = redis.call('HMGET', key, 'secret', 'retiredSecrets', 'previousSecret', 'rotatedAt')
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
  redis.call('HSET', key, 'retiredSecrets', cjson.encode(retired), 'previousSecret', old, 'rotatedAt', now, 'secret', newSecret)
end
