--[[
  Counts one inbound request of a source by outcome, unless the source is gone (a request racing
  its deletion must not bring back a partial record).

  KEYS[1] the source's record (hash)

  ARGV[1] received at (ISO 8601), '' for a delivery whose signature did not verify (lastReceivedAt stays)
  ARGV[2] last error as JSON, '' when the request was accepted
  ARGV[3] number of counts C, then C groups of 2: status (accepted, duplicate, ignored, rejected), how many
  then (optional) ARGV[4 + 2C] now (ms) and ARGV[5 + 2C] how long (ms) a verified delivery's error is kept
       over an unverified one's: anyone who knows the URL can send unsigned requests, and each one
       replaced the error of the provider's own deliveries (a mapping that fails, say) with its
       invalid_signature (probe DM); `lastErrorVerifiedAt` (ms) says when a verified one was written
  then (optional) ARGV[6 + 2C] the reason of an ignored delivery as JSON (`lastIgnored`), '' otherwise

  Returns 1 when counted, 0 when the source is gone.
]]
local rcall = redis.call
if rcall('EXISTS', KEYS[1]) == 0 then return 0 end
for i = 0, tonumber(ARGV[3]) - 1 do
  rcall('HINCRBY', KEYS[1], 'n:' .. ARGV[4 + i * 2], tonumber(ARGV[5 + i * 2]))
end
if ARGV[1] ~= '' then rcall('HSET', KEYS[1], 'lastReceivedAt', ARGV[1]) end
if ARGV[2] ~= '' then
  local c = tonumber(ARGV[3])
  local nowMs, keepMs = tonumber(ARGV[4 + c * 2] or ''), tonumber(ARGV[5 + c * 2] or '')
  if ARGV[1] ~= '' then
    rcall('HSET', KEYS[1], 'lastError', ARGV[2])
    if nowMs then rcall('HSET', KEYS[1], 'lastErrorVerifiedAt', nowMs) end
  else
    local verifiedAt = tonumber(rcall('HGET', KEYS[1], 'lastErrorVerifiedAt') or '')
    if not (nowMs and keepMs and verifiedAt and nowMs - verifiedAt < keepMs) then rcall('HSET', KEYS[1], 'lastError', ARGV[2]) end
  end
end
local ignored = ARGV[6 + tonumber(ARGV[3]) * 2]
if ignored and ignored ~= '' then rcall('HSET', KEYS[1], 'lastIgnored', ignored) end
return 1
