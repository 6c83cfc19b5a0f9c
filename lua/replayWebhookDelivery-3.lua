--[[
  Queues one extra attempt of a delivery (spec 3.2 replay): member `<delivery id>#<n>` due now in
  the endpoint's queue. It resends the stored payload and does not count toward the ten attempts.

  KEYS[1] the endpoint record              ({w:<ws>}:whk:<endpoint id>)
  KEYS[2] the delivery record              ({w:<ws>}:whd:<delivery id>)
  KEYS[3] the endpoint's attempt queue     ({w:<ws>}:whk:<endpoint id>:due)

  ARGV[1] endpoint id
  ARGV[2] delivery id
  ARGV[3] now (ms)
  ARGV[4] most replays of one delivery

  Returns the replay number n (1, 2, …), -2 when the endpoint or the delivery (of that endpoint) does
  not exist, -1 when the endpoint is disabled, -3 when the delivery was replayed ARGV[4] times already.
]]
local rcall = redis.call
if rcall('EXISTS', KEYS[1]) == 0 then return -2 end
if rcall('HGET', KEYS[2], 'endpointId') ~= ARGV[1] then return -2 end
if rcall('HGET', KEYS[1], 'enabled') ~= '1' then return -1 end
if tonumber(rcall('HGET', KEYS[2], 'replays') or '0') >= tonumber(ARGV[4]) then return -3 end
local n = rcall('HINCRBY', KEYS[2], 'replays', 1)
rcall('ZADD', KEYS[3], ARGV[3], ARGV[2] .. '#' .. n)
return n
