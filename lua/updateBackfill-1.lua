--[[
  Records a segment backfill's progress unless the segment changed under it: the write applies only
  while the stored backfill is the run the caller started (same `startedAt`), so a PATCH that reset
  it to `pending` (or a delete) is never overwritten by a stale job.

  KEYS[1] the segment hash
  ARGV[1] the run's startedAt ('' when the caller is starting a pending backfill)
  ARGV[2] the new backfill JSON      ARGV[3] the new cursor JSON ('' to leave it)

  Returns 1 when written, 0 otherwise.
]]
local current = redis.call('HGET', KEYS[1], 'backfill')
if not current then return 0 end
local b = cjson.decode(current)
if ARGV[1] == '' then
  if b.status ~= 'pending' then return 0 end
elseif b.status ~= 'running' or b.startedAt ~= ARGV[1] then
  return 0
end
redis.call('HSET', KEYS[1], 'backfill', ARGV[2])
if ARGV[3] ~= '' then redis.call('HSET', KEYS[1], 'backfillCursor', ARGV[3]) end
return 1
