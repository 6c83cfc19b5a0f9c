--[[
  Applies a PATCH to a webhook endpoint, deciding the side effects from the stored values:
  - a changed `url`, `events` or `tenantId` moves `activeSince` to now (spec 3.3: an edit never
    delivers events from before it);
  - `enabled` from 0 to 1 (re-enable) clears the failure streak (`failingSince`), `disabledAt` and
    `activeUntil`, and moves `activeSince` to now; from 1 to 0 sets `disabledAt` and `activeUntil`
    (ms: events from before it, read by a dispatcher only later, still get their deliveries).
  - when `activeSince` moves, the window that ends (from the old `activeSince` to now, or to
    `activeUntil` when disabled) is kept in `past` with the patterns and tenant it had, so an event
    from inside it that a dispatcher reads only after the change still gets its delivery, as the
    endpoint was then (probe A1: an edit or a re-enable while dispatchers were behind lost it). At
    most PAST_WINDOWS, none ended more than PAST_WINDOW_DAYS ago (10 windows lost the events of the
    oldest to a dozen edits made while no dispatcher ran, probe DF), and at most PAST_MAX_BYTES of
    JSON, the oldest going first: a window keeps its patterns, up to 100 of up to ~100 characters,
    and 100 such windows made a field of ~1 MB that every enqueue decoded (~12 ms of Redis each;
    review of session 56). A few hundred bytes a window is common: 100 windows then fit.

  Endpoint fields read: enabled, activeSince, activeUntil, events, tenantId, past (JSON list of
  { since, until, events, tenantId }; ms and the patterns as a list).

  A re-enable also notes that the endpoint's `pending` and `failed` deliveries are owed their
  re-queue (KEYS[3], endpoint id -> now): the caller re-queues them and clears the note; a process
  killed first leaves it to the dispatchers' sweep (streams/webhook-deliveries.ts requeueOwed).

  KEYS[1] the endpoint record              ({w:<ws>}:whk:<id>)
  KEYS[2] the endpoints' version counter   ({w:<ws>}:whks:v)
  KEYS[3] the re-queues owed               ({w:<ws>}:whks:requeue)

  ARGV[1] now (ms)
  ARGV[2] now (ISO 8601)
  ARGV[3] endpoint id
  ARGV[4] number of fields N, then N field, value pairs (url, description, events, tenantId, tenantSlug, enabled)

  Returns {} when the endpoint does not exist, else { before, after, reenabled } where before and
  after are the record as HGETALL lists and reenabled is 1 when this call enabled it again.
]]
local rcall = redis.call
local PAST_WINDOWS, PAST_WINDOW_DAYS, PAST_MAX_BYTES = 100, 7, 65536
if rcall('EXISTS', KEYS[1]) == 0 then return {} end
local before = rcall('HGETALL', KEYS[1])
local was = rcall('HMGET', KEYS[1], 'enabled', 'activeSince', 'activeUntil', 'events', 'tenantId', 'past')
local changed, moveActive, reenabled = false, false, 0
local n = tonumber(ARGV[4])
for i = 0, n - 1 do
  local field, value = ARGV[5 + 2 * i], ARGV[6 + 2 * i]
  local current = rcall('HGET', KEYS[1], field) or ''
  if current ~= value then
    changed = true
    rcall('HSET', KEYS[1], field, value)
    if field == 'url' or field == 'events' or field == 'tenantId' then moveActive = true end
    if field == 'enabled' and value == '1' then
      reenabled = 1
      moveActive = true
      rcall('HSET', KEYS[3], ARGV[3], ARGV[1])
      rcall('HSET', KEYS[1], 'failingSince', '', 'disabledAt', '', 'activeUntil', '')
    elseif field == 'enabled' then
      rcall('HSET', KEYS[1], 'disabledAt', ARGV[2], 'activeUntil', ARGV[1])
    end
  end
end
if moveActive then
  local nowMs = tonumber(ARGV[1])
  local since = tonumber(was[2] or '0') or 0
  local untilMs = was[1] == '1' and nowMs or (tonumber(was[3] or '') or 0)
  local past = {}
  if was[6] and was[6] ~= '' then
    for _, w in ipairs(cjson.decode(was[6])) do
      if w['until'] >= nowMs - PAST_WINDOW_DAYS * 86400000 then past[#past + 1] = w end
    end
  end
  if untilMs > since then
    past[#past + 1] = { since = since, ['until'] = untilMs, events = cjson.decode(was[4] or '["*"]'), tenantId = was[5] or '' }
  end
  while #past > PAST_WINDOWS do table.remove(past, 1) end
  local encoded = #past > 0 and cjson.encode(past) or ''
  while #encoded > PAST_MAX_BYTES do
    table.remove(past, 1)
    encoded = #past > 0 and cjson.encode(past) or ''
  end
  rcall('HSET', KEYS[1], 'activeSince', ARGV[1], 'past', encoded)
end
if changed then
  rcall('HSET', KEYS[1], 'updatedAt', ARGV[2])
  rcall('INCR', KEYS[2])
end
return { before, rcall('HGETALL', KEYS[1]), reenabled }
