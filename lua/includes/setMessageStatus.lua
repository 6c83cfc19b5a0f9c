-- Sets a message record's status from `current` to `to`, keeping the per-status indexes
-- ({t}:messages:<status>) exact.
local function setMessageStatus(record, base, id, current, to)
  redis.call('ZREM', base .. ':messages:' .. current, id)
  redis.call('ZADD', base .. ':messages:' .. to, 0, id)
  redis.call('HSET', record, 'status', to)
end
