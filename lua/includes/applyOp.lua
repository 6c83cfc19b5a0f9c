-- Applies one record operation of a compare-and-set write (lua/writeSubscriber, lua/commitAutomation):
-- hset key field value | hdel key field | del key | sadd key member | srem key member
-- | zadd key score member | zrem key member | hincrby key field by | pexpireat key ms.
-- Returns nil when applied, or an error reply for an unknown op.
local function applyOp(op, key, a, b)
  if op == 'hset' then redis.call('HSET', key, a, b)
  elseif op == 'hdel' then redis.call('HDEL', key, a)
  elseif op == 'del' then redis.call('DEL', key)
  elseif op == 'sadd' then redis.call('SADD', key, a)
  elseif op == 'srem' then redis.call('SREM', key, a)
  elseif op == 'zadd' then redis.call('ZADD', key, a, b)
  elseif op == 'zrem' then redis.call('ZREM', key, a)
  elseif op == 'hincrby' then redis.call('HINCRBY', key, a, b)
  elseif op == 'pexpireat' then redis.call('PEXPIREAT', key, a)
  else return redis.error_reply('unknown record op ' .. tostring(op)) end
  return nil
end
