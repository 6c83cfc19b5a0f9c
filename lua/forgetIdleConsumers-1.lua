--[[
  Deletes the consumers of a stream's group that hold no pending entry and have not read for at
  least ARGV[2] ms: names left by processes that died (a SIGKILL never leaves its groups). Atomic,
  so a consumer that reads an entry between the check and the delete cannot lose it (XGROUP
  DELCONSUMER drops a consumer's pending entries). A live consumer reads at least every few
  seconds; one deleted anyway is recreated by its next XREADGROUP.

  KEYS[1] the stream

  ARGV[1] group
  ARGV[2] least idle time (ms)
  ARGV[3] the caller's own consumer name (never deleted)
  ARGV[4] at most this many consumers deleted by this call

  Returns the number of consumers deleted.
]]
local rcall = redis.call
local ok, consumers = pcall(rcall, 'XINFO', 'CONSUMERS', KEYS[1], ARGV[1])
if not ok then return 0 end -- no such stream or group
local minIdle, limit = tonumber(ARGV[2]), tonumber(ARGV[4])
local deleted = 0
for _, row in ipairs(consumers) do
  if deleted >= limit then break end
  local c = {}
  for i = 1, #row, 2 do c[row[i]] = row[i + 1] end
  if c.name ~= ARGV[3] and tonumber(c.pending) == 0 and tonumber(c.idle) >= minIdle then
    rcall('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], c.name)
    deleted = deleted + 1
  end
end
return deleted
