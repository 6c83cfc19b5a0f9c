-- Records a write's pending audit entries in its slot's outbox (streams/audit-outbox.ts), in the
-- same script as the write: `intent` is the intent's JSON, `reply` what the script returns (its
-- outcome, from which the entries are made). Call it only on a path that wrote something.
local function recordAudit(outbox, token, intent, reply)
  redis.call('HSET', outbox, token, intent .. '\n' .. cjson.encode(reply))
end
