--[[
  Rotates a webhook endpoint's signing secret: the current one becomes the previous one (which
  keeps signing and verifying for 24 hours from `rotatedAt`, spec 6.2.8) and the new one is current.
  A second rotation within the window replaces the previous secret.

  KEYS[1] the endpoint record              ({w:<ws>}:whk:<id>)
  KEYS[2] the endpoints' version counter   ({w:<ws>}:whks:v)

  ARGV[1] the new secret (whsec_…)
  ARGV[2] now (ms)
  ARGV[3] now (ISO 8601)

  Returns {} when the endpoint does not exist, else { before, after } as HGETALL lists.
]]
local rcall = redis.call
if rcall('EXISTS', KEYS[1]) == 0 then return {} end
local before = rcall('HGETALL', KEYS[1])
local old = rcall('HGET', KEYS[1], 'secret')
rcall('HSET', KEYS[1], 'previousSecret', old, 'rotatedAt', ARGV[2], 'secret', ARGV[1], 'updatedAt', ARGV[3])
rcall('INCR', KEYS[2])
return { before, rcall('HGETALL', KEYS[1]) }
