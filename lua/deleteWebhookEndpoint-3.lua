--[[
  Deletes a webhook endpoint with its attempt queue, per-status delivery indexes and any note that its
  `webhook.disabled` audit event is still to be appended or its deliveries re-queued. Its index of all deliveries is renamed to
  its purge index and the id listed in the workspace's purges, for the dispatchers' sweep to remove
  the delivery records and payloads a batch at a time (lua/purgeWebhookDeliveries; until then they
  stayed until their keep, probes BW, EG): one rename, whatever the number of deliveries. An attempt
  in flight finds no endpoint and stops there.

  KEYS[1] the endpoint record              ({w:<ws>}:whk:<id>)
  KEYS[2] the workspace's endpoint index   ({w:<ws>}:whks)
  KEYS[3] the endpoints' version counter   ({w:<ws>}:whks:v)

  ARGV[1] the workspace key base ({w:<ws>} with the key prefix); per-endpoint names as in streams/keys.ts
  ARGV[2] endpoint id

  Returns {} when the endpoint does not exist, else { before, endpointsLeft } (before as an HGETALL list).
]]
local rcall = redis.call
if rcall('EXISTS', KEYS[1]) == 0 then return {} end
local before = rcall('HGETALL', KEYS[1])
local e = ARGV[1] .. ':whk:' .. ARGV[2]
rcall('DEL', KEYS[1])
rcall('ZREM', KEYS[2], ARGV[2])
rcall('INCR', KEYS[3])
rcall('HDEL', ARGV[1] .. ':whks:unannounced', ARGV[2])
rcall('HDEL', ARGV[1] .. ':whks:requeue', ARGV[2])
if rcall('EXISTS', e .. ':dlv') == 1 then
  rcall('RENAME', e .. ':dlv', e .. ':purge')
  rcall('SADD', ARGV[1] .. ':whks:purge', ARGV[2])
end
rcall('UNLINK', e .. ':due', e .. ':dlv:pending', e .. ':dlv:success', e .. ':dlv:failed', e .. ':dlv:exhausted')
return { before, rcall('ZCARD', KEYS[2]) }
