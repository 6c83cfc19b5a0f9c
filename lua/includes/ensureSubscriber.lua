-- @include "appendInboxEvent"
-- Returns the subscriber id of tenant|externalId in this partition, creating the subscriber on its
-- first sighting: the `subs` entry, the record (id, externalId, createdAt), the tenant's index
-- entry, and `$subscriber.created` (sequence 1 of a new subscriber) on the inbox.
-- p = { inbox, seq, subs, base, tenant, workspace, received, receivedIso }; returns id, createdSequence (0 when it existed)
local function ensureSubscriber(p, externalId, newSub, createdEventId)
  local field = p.tenant .. '|' .. externalId
  local sub = redis.call('HGET', p.subs, field)
  if sub then return sub, 0 end
  redis.call('HSET', p.subs, field, newSub)
  redis.call('HSET', p.base .. ':sub:' .. p.tenant .. ':' .. externalId, 'id', newSub, 'externalId', externalId, 'createdAt', p.receivedIso, 'updatedAt', p.receivedIso)
  redis.call('ZADD', p.base .. ':subidx:' .. p.tenant, 0, newSub .. '|' .. externalId)
  local seq = redis.call('HINCRBY', p.seq, field, 1)
  appendInboxEvent(p.inbox, { t = p.tenant, w = p.workspace, id = createdEventId, q = seq, x = externalId, u = newSub,
    n = '$subscriber.created', o = 'system', ts = p.received, r = p.received, d = '{}' })
  return newSub, seq
end
