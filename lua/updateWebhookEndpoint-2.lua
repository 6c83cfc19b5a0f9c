--[[
  Applies a PATCH to a webhook endpoint, deciding the side effects from the stored values:
  - a changed `url`, `events` or `tenantId` moves `activeSince` to now (spec 3.3: an edit never
    delivers events from before it);
  - `enabled` from 0 to 1 (re-enable) clears the failure streak (`failingSince`), `disabledAt` and
    `activeUntil`, and moves `activeSince` to now; from 1 to 0 sets `disabledAt` and `activeUntil`
    (ms: events from before it, read by a dispatcher only later, still get their deliveries).

  KEYS[1] the endpoint record              ({w:<ws>}:whk:<id>)
  KEYS[2] the endpoints' version counter   ({w:<ws>}:whks:v)

  ARGV[1] now (ms)
  ARGV[2] now (ISO 8601)
  ARGV[3] number of fields N, then N field, value pairs (url, description, events, tenantId, tenantSlug, enabled)

  Returns {} when the endpoint does not exist, else { before, after, reenabled } where before and
  after are the record as HGETALL lists and reenabled is 1 when this call enabled it again.
]]
local rcall = redis.call
if rcall('EXISTS', KEYS[1]) == 0 then return {} end
local before = rcall('HGETALL', KEYS[1])
local changed, moveActive, reenabled = false, false, 0
local n = tonumber(ARGV[3])
for i = 0, n - 1 do
  local field, value = ARGV[4 + 2 * i], ARGV[5 + 2 * i]
  local current = rcall('HGET', KEYS[1], field) or ''
  if current ~= value then
    changed = true
    rcall('HSET', KEYS[1], field, value)
    if field == 'url' or field == 'events' or field == 'tenantId' then moveActive = true end
    if field == 'enabled' and value == '1' then
      reenabled = 1
      moveActive = true
      rcall('HSET', KEYS[1], 'failingSince', '', 'disabledAt', '', 'activeUntil', '')
    elseif field == 'enabled' then
      rcall('HSET', KEYS[1], 'disabledAt', ARGV[2], 'activeUntil', ARGV[1])
    end
  end
end
if moveActive then rcall('HSET', KEYS[1], 'activeSince', ARGV[1]) end
if changed then
  rcall('HSET', KEYS[1], 'updatedAt', ARGV[2])
  rcall('INCR', KEYS[2])
end
return { before, rcall('HGETALL', KEYS[1]), reenabled }
