--[[
  Rotates a webhook endpoint's signing secret (spec 6.2.8): the current one is retired, and keeps
  signing and verifying for 24 hours from this rotation; the new one is current.

  Retired secrets are kept as lua/includes/retireSecret says: at most ARGV[5], each until 24 hours
  after its rotation. `previousSecret` keeps naming the newest retired secret and `rotatedAt` the
  last rotation, which processes of the earlier version read during a rolling upgrade (and
  `secretRotatedAt` shows).

  KEYS[1] the endpoint record              ({w:<ws>}:whk:<id>)
  KEYS[2] the endpoints' version counter   ({w:<ws>}:whks:v)

  ARGV[1] the new secret (whsec_…)
  ARGV[2] now (ms)
  ARGV[3] now (ISO 8601)
  ARGV[4] how long a retired secret keeps signing (ms)
  ARGV[5] most retired secrets kept

  Returns {} when the endpoint does not exist, else { before, after } as HGETALL lists.
]]
-- @include "retireSecret"
local rcall = redis.call
if rcall('EXISTS', KEYS[1]) == 0 then return {} end
local before = rcall('HGETALL', KEYS[1])
retireSecret(KEYS[1], ARGV[1], ARGV[2], tonumber(ARGV[4]), tonumber(ARGV[5]))
rcall('HSET', KEYS[1], 'updatedAt', ARGV[3])
rcall('INCR', KEYS[2])
return { before, rcall('HGETALL', KEYS[1]) }
