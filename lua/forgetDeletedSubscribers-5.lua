--[[
  The retention sweeper's step for deleted subscribers (actors/retention-sweeper.ts): forgets the
  per-subscriber state of a partition that its delete (or merge) could not remove at once, because
  the subscriber's events were still on their way through the actors: its last issued and last
  applied sequences (fields of {pN}:seq and {pN}:applied) and its automation hash ({pN}:auto:…,
  counters, segments held, cursor). Without this every externalId ever deleted left ~260 bytes
  behind for good.

  A deleted subscriber is listed in KEYS[1] (member `tenant|externalId`, score: ms of the deletion)
  by the delete's own write (streams/subscribers.ts). Its state goes, in this one atomic call, only
  when all of these hold; otherwise it is looked at again RETRY ms later (its score moved forward,
  as if deleted later, which keeps the pending check below conservative):
  - it has not been created again (then it is simply unlisted: its state is in use);
  - its timeline has expired (so a subscriber created again, whose sequences restart at 1, never
    shares a timeline, ordered by sequence, with its predecessor);
  - every sequence issued was applied (applied = issued);
  - the actors' group holds no pending inbox entry from before the deletion (+ a clock margin): a
    pending entry is delivered again after a crash, and with the applied sequence gone it would
    be applied twice. An entry is acked after both its read models and its automation step, so
    none of the subscriber's pending means the automation step is done with it too (its cursor
    may stay behind for good: it moves only for events some definition acts on).

  KEYS[1] deleted subscribers ({pN}:gone)  KEYS[2] subscribers hash ({pN}:subs)
  KEYS[3] sequence hash ({pN}:seq)         KEYS[4] applied hash ({pN}:applied)
  KEYS[5] partition inbox ({pN}:in)
  ARGV[1] partition key base ({pN} with the key prefix; timeline and automation keys are built from
          it with the suffixes of streams/keys.ts)
  ARGV[2] deleted before (ms): only deletions at or before it are looked at
  ARGV[3] the most to look at
  ARGV[4] the actors' consumer group
  ARGV[5] clock margin (ms)
  ARGV[6] RETRY (ms): a postponed one gets the score ARGV[2] + RETRY

  Returns { forgotten, unlisted (created again), postponed }.
]]
local rcall = redis.call
local base, group = ARGV[1], ARGV[4]
local before, margin, retry = tonumber(ARGV[2]), tonumber(ARGV[5]), tonumber(ARGV[6])

local due = rcall('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[2], 'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[3]))
if #due == 0 then return { 0, 0, 0 } end

-- the oldest entry the actors' group read and did not ack yet (nil: none); no group or no stream:
-- nothing can be known to be done
local oldestPending, unknown = nil, false
local ok, pending = pcall(rcall, 'XPENDING', KEYS[5], group)
if not ok then
  unknown = true
elseif tonumber(pending[1]) > 0 then
  oldestPending = tonumber(string.match(pending[2], '^(%d+)'))
end

local forgotten, unlisted, postponed = 0, 0, 0
for i = 1, #due, 2 do
  local member, deletedAt = due[i], tonumber(due[i + 1])
  local cut = string.find(member, '|', 1, true)
  local tenant, externalId = string.sub(member, 1, cut - 1), string.sub(member, cut + 1)
  if rcall('HEXISTS', KEYS[2], member) == 1 then
    rcall('ZREM', KEYS[1], member)
    unlisted = unlisted + 1
  else
    local autoKey = base .. ':auto:' .. tenant .. ':' .. externalId
    local issued = rcall('HGET', KEYS[3], member)
    local done = not unknown
      and (oldestPending == nil or oldestPending > deletedAt + margin)
      and issued == rcall('HGET', KEYS[4], member)
      and rcall('EXISTS', base .. ':tl:' .. tenant .. ':' .. externalId) == 0
    if done then
      rcall('HDEL', KEYS[3], member)
      rcall('HDEL', KEYS[4], member)
      rcall('DEL', autoKey)
      rcall('ZREM', KEYS[1], member)
      forgotten = forgotten + 1
    else
      rcall('ZADD', KEYS[1], before + retry, member)
      postponed = postponed + 1
    end
  end
end
return { forgotten, unlisted, postponed }
