--[[
  The retention sweeper's step for tenants that stopped writing to a partition
  (actors/retention-sweeper.ts): a tenant whose last apply here is older than the retention and
  whose tenant log the sweep has trimmed empty leaves the partition's tenant list, its empty log
  stream goes, and so do its sample lists (ids of log entries that are gone). Its catalog stays:
  it holds the all-time counts, first and last seen of each name (spec 4.3). Without this every
  tenant that ever wrote kept a member and an empty stream in each partition it touched.

  Atomic against lua/applyEvents (same slot): a tenant applied to since the sweep read its score
  has a newer score and is left alone, and one whose log still holds an entry is too.

  KEYS[1] partition tenants ({pN}:tenants, score: ms of the tenant's last apply here)
  ARGV[1] partition key base ({pN} with the key prefix; log, catalog and sample keys are built from
          it with the suffixes of streams/keys.ts: :log:<t>, :cat:<t>, :smp:<t>:<name>)
  ARGV[2] cutoff (ms): only a tenant whose score is below it goes
  ARGV[3..] tenant ids to look at

  Returns the number of tenants forgotten.
]]
local rcall = redis.call
local base, cutoff = ARGV[1], tonumber(ARGV[2])
local forgotten = 0
for i = 3, #ARGV do
  local t = ARGV[i]
  local score = tonumber(rcall('ZSCORE', KEYS[1], t) or 'inf')
  local log = base .. ':log:' .. t
  if score < cutoff and rcall('XLEN', log) == 0 then
    rcall('DEL', log)
    for _, field in ipairs(rcall('HKEYS', base .. ':cat:' .. t)) do
      local name = string.match(field, '^(.-)|all$')
      if name then rcall('DEL', base .. ':smp:' .. t .. ':' .. name) end
    end
    rcall('ZREM', KEYS[1], t)
    forgotten = forgotten + 1
  end
end
return forgotten
