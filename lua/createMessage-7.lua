--[[
  Creates a message, deciding its Idempotency-Key atomically: a key seen with the same request
  answers the original message; with another request it is a conflict. Keys never expire.

  KEYS[1] idempotency hash ({t}:idem)          field key -> messageId|requestHash (a caller's
                                               Idempotency-Key, or a run step's key, which begins with NUL)
  KEYS[2] the new message record ({t}:msg:<id>)
  KEYS[3] message index ({t}:messages)
  KEYS[4] index of the initial status ({t}:messages:<status>)
  KEYS[5] fan-out queue of the message's lane ({t}:msgq or {t}:msgq:audience; the record's `lane`)
  KEYS[6] scheduled messages ({t}:msg-due)
  KEYS[7] the tenant's audit outbox ({t}:outbox, lua/includes/recordAudit)

  ARGV[1] Idempotency-Key ('' for none)
  ARGV[2] request hash (sha256 of the canonical request)
  ARGV[3] message id
  ARGV[4] sendAt ms ('' to send now)
  ARGV[5] audit intent token ('' to record none), ARGV[6] audit intent of `message.created` (a
          caller's request or a workflow run's send): recorded only when the message is created,
          never on a replay, so a run step retried under its key adds no second entry
  ARGV[7] number of record fields F, then F field/value pairs

  Returns { 1, id } created, { 2, originalId } same key and request (replay), { 0, originalId } same key, other request.
]]
-- @include "recordAudit"
local rcall = redis.call
if ARGV[1] ~= '' then
  local seen = rcall('HGET', KEYS[1], ARGV[1])
  if seen then
    local bar = string.find(seen, '|', 1, true)
    local id, hash = string.sub(seen, 1, bar - 1), string.sub(seen, bar + 1)
    if hash == ARGV[2] then return { 2, id } end
    return { 0, id }
  end
  rcall('HSET', KEYS[1], ARGV[1], ARGV[3] .. '|' .. ARGV[2])
end
local n = tonumber(ARGV[7])
rcall('HSET', KEYS[2], unpack(ARGV, 8, 7 + 2 * n)) -- one command for the ~17 fields
rcall('ZADD', KEYS[3], 0, ARGV[3])
rcall('ZADD', KEYS[4], 0, ARGV[3])
if ARGV[4] ~= '' then
  rcall('ZADD', KEYS[6], ARGV[4], ARGV[3])
else
  rcall('XADD', KEYS[5], '*', 'm', ARGV[3])
end
local reply = { 1, ARGV[3] }
if ARGV[5] ~= '' then recordAudit(KEYS[7], ARGV[5], ARGV[6], reply) end
return reply
