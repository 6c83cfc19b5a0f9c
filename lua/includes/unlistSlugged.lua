-- Takes a slugged record (topic, segment, workflow) out of its tenant's listings: frees its slug
-- (only while the slug still names this id: a newer record may hold it) and removes the id from
-- the index. The record itself is left to the caller, which deletes it with what else goes.
local function unlistSlugged(slugIndex, index, recordKey, id)
  local slug = redis.call('HGET', recordKey, 'slug')
  if slug and redis.call('HGET', slugIndex, slug) == id then redis.call('HDEL', slugIndex, slug) end
  redis.call('ZREM', index, id)
end
