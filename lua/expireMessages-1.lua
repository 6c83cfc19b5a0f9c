--[[
  Expires a tenant's messages that ended (completed, canceled, failed) before the cutoff, oldest
  end first: their deliveries go (records, the message's delivery indexes), at most ARGV[3] of them
  per call, so a broadcast of a million deliveries is deleted over many short calls. Once a
  message has no delivery left it leaves {t}:msg-ended, and its record goes with its index entries,
  unless a caller's Idempotency-Key names it (`idem` 1, or a record written before `idem` was: kept,
  since keys never expire and a replay answers the original message, its counts included). A
  workflow run step's message takes its engine idempotency key (`\0run:<runId>:<step>`) with it.
  Every step is idempotent: a call cut short (a killed process) is finished by the next sweep.

  KEYS[1] the tenant's ended messages ({t}:msg-ended: message id → end ms)

  ARGV[1] tenant key base ({t} with the key prefix): records and indexes are built from it as
          streams/keys.ts builds them
  ARGV[2] cutoff (ms): messages that ended at or before it expire
  ARGV[3] at most this many deliveries deleted by this call
  ARGV[4] at most this many messages looked at by this call

  Returns { messages expired (record deleted or kept without deliveries), deliveries deleted,
            1 when messages past the cutoff remain, else 0 }.
]]
local rcall = redis.call
local base, budget = ARGV[1], tonumber(ARGV[3])
local ended = rcall('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[2], 'LIMIT', 0, tonumber(ARGV[4]))
local STATUSES = { 'pending', 'sent', 'failed', 'skipped', 'canceled' }
local expired, deleted = 0, 0
for _, id in ipairs(ended) do
  if budget <= 0 then break end
  local record, index = base .. ':msg:' .. id, base .. ':msg-dlv:' .. id
  local ids = rcall('ZRANGE', index, 0, budget - 1)
  for _, d in ipairs(ids) do
    local key = base .. ':dlv:' .. d
    local status = rcall('HGET', key, 'status')
    if status then rcall('ZREM', index .. ':' .. status, d) end
    rcall('DEL', key)
  end
  if #ids > 0 then
    rcall('ZREM', index, unpack(ids))
    deleted = deleted + #ids
    budget = budget - #ids
  end
  if rcall('EXISTS', index) == 0 then
    for _, s in ipairs(STATUSES) do rcall('DEL', index .. ':' .. s) end
    local h = rcall('HMGET', record, 'status', 'idem', 'run')
    local status, idem, run = h[1], h[2], h[3]
    if status and (idem == '0' or (idem == false and run)) then
      if run then
        local ok, ref = pcall(cjson.decode, run)
        if ok and type(ref) == 'table' and ref.runId and ref.step then
          rcall('HDEL', base .. ':idem', '\0run:' .. ref.runId .. ':' .. ref.step)
        end
      end
      rcall('DEL', record)
      rcall('ZREM', base .. ':messages', id)
      rcall('ZREM', base .. ':messages:' .. status, id)
    end
    rcall('ZREM', KEYS[1], id)
    expired = expired + 1
  end
end
local more = 0
if #rcall('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[2], 'LIMIT', 0, 1) > 0 then more = 1 end
return { expired, deleted, more }
