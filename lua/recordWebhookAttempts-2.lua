--[[
  Records the results of webhook attempts, each exactly once: a result counts only while its claim
  token still holds the attempt's lease, so a late duplicate (a dispatcher whose lease expired and
  whose attempt another one took over) records nothing. Per result, atomically:
  - the attempt is stored on the delivery (`a:<n>`, n counting every attempt, replays included);
  - status (spec 3.2): 2xx → success from pending or failed (a queued retry is dropped); a
    failed scheduled attempt → failed with the next attempt queued after the retry schedule, or
    exhausted after the last one; a replay changes no other status ("unchanged by this row"): an
    exhausted delivery stays exhausted whatever its replay answers, a failed replay leaves the
    status as it was, and a finished delivery stays success; the delivery moves to its new
    status's index with the score it has in the index of all;
  - the endpoint's failure streak (spec 3.3): a success clears `failingSince`; a failure sets it
    when empty, and disables the endpoint when it is at least `disable after` old, noting it in
    {w:<ws>}:whks:unannounced until its `webhook.disabled` audit event is in the ledger.

  KEYS[1] the workspace's in-flight attempts ({w:<ws>}:whd-inflight)
  KEYS[2] the workspace's attempt leases     ({w:<ws>}:whd-leases)

  ARGV[1] the workspace key base ({w:<ws>} with the key prefix); other names as in streams/keys.ts
  ARGV[2] now (ms)
  ARGV[3] now (ISO 8601)
  ARGV[4] scheduled attempts before `exhausted` (10)
  ARGV[5] disable after (ms) of continuous failure
  ARGV[6] number of retry delays S, then S delays (ms): after the 1st failure, the 2nd, …; the last repeats
  then the number of results N, then per result: member, claim token, success (1 or 0),
       status code ('' for none), the attempt record (JSON)

  Returns one item per result: { recorded (1 or 0), status after, endpoint id if this disabled it else '' }.
]]
local rcall = redis.call
local base, nowMs, nowIso, maxAttempts, disableAfter = ARGV[1], tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
local delays = {}
local s = tonumber(ARGV[6])
for i = 1, s do delays[i] = tonumber(ARGV[6 + i]) end
local at = 7 + s
local count = tonumber(ARGV[at])
at = at + 1

local out = {}
for _ = 1, count do
  local member, token, success, statusCode, record = ARGV[at], ARGV[at + 1], ARGV[at + 2] == '1', ARGV[at + 3], ARGV[at + 4]
  at = at + 5
  local deliveryId, replay = string.match(member, '^([^#]+)#?(%d*)$')
  local d = base .. ':whd:' .. deliveryId
  if rcall('HGET', KEYS[2], member) ~= token or rcall('EXISTS', d) == 0 then
    out[#out + 1] = { 0, '', '' }
  else
    rcall('HDEL', KEYS[2], member)
    rcall('ZREM', KEYS[1], member)
    local n = rcall('HINCRBY', d, 'n', 1)
    rcall('HSET', d, 'a:' .. n, record, 'lastAttemptAt', nowIso, 'lastStatusCode', statusCode, 'updatedAt', nowIso)
    local h = rcall('HMGET', d, 'status', 'endpointId')
    local status, endpointId = h[1], h[2]
    local e = base .. ':whk:' .. endpointId
    local exists = rcall('EXISTS', e) == 1
    local attempts = replay == '' and rcall('HINCRBY', d, 'attempts', 1) or nil
    local after = status
    if success then
      if status ~= 'exhausted' then after = 'success' end
      rcall('ZREM', e .. ':due', deliveryId)
      rcall('HSET', d, 'nextAttemptAt', '')
    elseif attempts and status ~= 'success' then
      if attempts >= maxAttempts then
        after = 'exhausted'
        rcall('HSET', d, 'nextAttemptAt', '')
      else
        after = 'failed'
        local next = nowMs + delays[math.min(attempts, s)]
        if exists then rcall('ZADD', e .. ':due', next, deliveryId) end
        rcall('HSET', d, 'nextAttemptAt', next)
      end
    end
    if after ~= status then
      local idx = e .. ':dlv'
      if exists then
        -- the per-status index takes the delivery's score in the index of all (its place by createdAt)
        local score = rcall('ZSCORE', idx, deliveryId)
        rcall('ZREM', idx .. ':' .. status, deliveryId)
        if score then rcall('ZADD', idx .. ':' .. after, score, deliveryId) end
      end
      rcall('HSET', d, 'status', after)
    end
    local disabled = ''
    if exists then
      if success then
        rcall('HSET', e, 'failingSince', '')
      else
        local since = tonumber(rcall('HGET', e, 'failingSince') or '')
        if not since then
          rcall('HSET', e, 'failingSince', nowMs)
        elseif nowMs - since >= disableAfter and rcall('HGET', e, 'enabled') == '1' then
          rcall('HSET', e, 'enabled', '0', 'disabledAt', nowIso, 'activeUntil', ARGV[2], 'updatedAt', nowIso)
          rcall('INCR', base .. ':whks:v')
          -- the audit event is appended by the caller; until it is, the endpoint waits here (a crash in
          -- between leaves it for the housekeeping sweep)
          rcall('HSET', base .. ':whks:unannounced', endpointId, nowIso)
          disabled = endpointId
        end
      end
    end
    out[#out + 1] = { 1, after, disabled }
  end
end
return out
