--[[
  Moves a message from one status to another when it is in one of the expected statuses, keeping
  the per-status indexes exact. Scheduled messages leave the due set; a message moved to `queued`
  is appended to the fan-out queue of its lane (the record's `lane`: `audience` → {t}:msgq:audience,
  else {t}:msgq, as streams/keys.ts names them).

  KEYS[1] the message record ({t}:msg:<id>)
  KEYS[2] the tenant's audit outbox ({t}:outbox, lua/includes/recordAudit)

  ARGV[1] tenant key base ({t} with the key prefix): status indexes, queue and due set are built from it
  ARGV[2] message id
  ARGV[3] expected statuses, comma-separated
  ARGV[4] new status
  ARGV[5] audit intent token ('' when the move is not audited), ARGV[6] audit intent (recorded when
          the message moved)
  ARGV[7] number of extra fields F, then F field/value pairs to set

  Returns { 1, previousStatus } when moved ({ 1, previousStatus, record } when audited, the record
          after the move as HGETALL's flat list), { 0, currentStatus } otherwise ('' for an unknown
          message).
]]
-- @include "setMessageStatus"
-- @include "recordAudit"
local rcall = redis.call
local base, id, to = ARGV[1], ARGV[2], ARGV[4]
local current = rcall('HGET', KEYS[1], 'status')
if not current then return { 0, '' } end
local allowed = false
for s in string.gmatch(ARGV[3], '[^,]+') do if s == current then allowed = true end end
if not allowed then return { 0, current } end
setMessageStatus(KEYS[1], base, id, current, to)
local n = tonumber(ARGV[7])
for i = 0, n - 1 do rcall('HSET', KEYS[1], ARGV[8 + 2 * i], ARGV[9 + 2 * i]) end
if current == 'scheduled' then rcall('ZREM', base .. ':msg-due', id) end
if to == 'queued' then
  local queue = base .. ':msgq'
  if rcall('HGET', KEYS[1], 'lane') == 'audience' then queue = queue .. ':audience' end
  rcall('XADD', queue, '*', 'm', id)
end
if ARGV[5] == '' then return { 1, current } end
local reply = { 1, current, rcall('HGETALL', KEYS[1]) }
recordAudit(KEYS[2], ARGV[5], ARGV[6], reply)
return reply
