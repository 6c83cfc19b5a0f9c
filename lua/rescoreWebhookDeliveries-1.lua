--[[
  Gives deliveries indexed at score 0 their score by createdAt: those stored before the delivery
  indexes were scored (listed by id then), and those a dispatcher of that earlier version still
  makes or moves between per-status indexes during a rolling upgrade. Per id:
  - at 0 in the endpoint's index of all: the given score there and in whichever per-status index
    holds it, or, when its record is gone (''), out of every index;
  - scored there already: that score in any per-status index holding it at 0;
  - not there at all: out of any per-status index holding it at 0.
  Anything not at 0 is left alone, so a call that lost a race with another changes nothing twice.

  KEYS[1] the endpoint's index of all deliveries ({w:<ws>}:whk:<endpoint id>:dlv)

  ARGV pairs: delivery id, its score by createdAt ('' when its record is gone)

  Returns how many ids changed.
]]
local rcall = redis.call
local statuses = { 'pending', 'success', 'failed', 'exhausted' }
local changed = 0
for i = 1, #ARGV, 2 do
  local id, score = ARGV[i], ARGV[i + 1]
  local current = rcall('ZSCORE', KEYS[1], id)
  if current == '0' then
    changed = changed + 1
    if score == '' then
      rcall('ZREM', KEYS[1], id)
      for _, status in ipairs(statuses) do rcall('ZREM', KEYS[1] .. ':' .. status, id) end
    else
      rcall('ZADD', KEYS[1], 'XX', score, id)
      for _, status in ipairs(statuses) do rcall('ZADD', KEYS[1] .. ':' .. status, 'XX', score, id) end
    end
  else
    local touched = false
    for _, status in ipairs(statuses) do
      local idx = KEYS[1] .. ':' .. status
      if rcall('ZSCORE', idx, id) == '0' then
        touched = true
        if current then rcall('ZADD', idx, 'XX', current, id) else rcall('ZREM', idx, id) end
      end
    end
    if touched then changed = changed + 1 end
  end
end
return changed
