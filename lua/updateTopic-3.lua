--[[
  Changes fields of a topic's record if the topic exists. `updatedAt` moves only when a value
  actually changes. Before and after are read in the same step, so the caller's audit entry
  reports exactly what this call changed even under concurrent updates.

  KEYS[1] the topic's record (hash)
  KEYS[2] the topic's members (zset), counted for the answer
  KEYS[3] the tenant's audit outbox (hash, lua/includes/recordAudit)

  ARGV[1] updatedAt (ISO 8601)
  ARGV[2] audit intent token, ARGV[3] audit intent (recorded when a value changed)
  ARGV[4] number of fields F, then F groups of 2: field, value ('' removes the field)

  Returns { 1, before, after, members } (records as HGETALL's flat list, members the member count)
          when the topic exists,
          { 0 } when it does not (nothing written).
]]
-- @include "recordAudit"
-- @include "changeFields"
local rcall = redis.call
if rcall('EXISTS', KEYS[1]) == 0 then return { 0 } end
local before = rcall('HGETALL', KEYS[1])
local changed = changeFields(KEYS[1], 5, tonumber(ARGV[4]))
local reply = { 1, before, {}, rcall('ZCARD', KEYS[2]) }
if changed then rcall('HSET', KEYS[1], 'updatedAt', ARGV[1]) end
reply[3] = rcall('HGETALL', KEYS[1])
if changed then recordAudit(KEYS[3], ARGV[2], ARGV[3], reply) end
return reply
