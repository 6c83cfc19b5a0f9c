--[[
  Keeps or acks the entries of a batch that a consumer of a shared group still owns. In a shared
  group another process claims an entry once it has been idle long enough (a dead process's), so
  a live one working a long batch keeps its claims fresh ('touch': XCLAIM to itself with min-idle
  0, which resets the idle time without counting a delivery), and acks at the end only what is
  still its own ('ack'): XACK takes an entry out of whoever's pending list holds it, so acking one
  another process claimed meanwhile would take its work away from it. A stopping consumer gives its
  batch back ('requeue'): each entry still its own is added again at the stream's end with the same
  fields, where the group's live consumers read it at once, and acked (the message queues only: their
  entries name resumable work, streams/stream-consumer.ts `giveBackOnStop`).

  KEYS[1] the stream

  ARGV[1] group
  ARGV[2] consumer
  ARGV[3] 'touch', 'ack' or 'requeue'
  ARGV[4..] the batch's entry ids (at most a few hundred)

  Returns the number of the batch's entries the consumer does not own (any more).
]]
local rcall = redis.call
local mine = {}
for i = 4, #ARGV do
  local pending = rcall('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1, ARGV[2])
  if #pending == 1 then mine[#mine + 1] = ARGV[i] end
end
if #mine > 0 then
  if ARGV[3] == 'touch' then
    local args = { KEYS[1], ARGV[1], ARGV[2], 0 }
    for _, id in ipairs(mine) do args[#args + 1] = id end
    args[#args + 1] = 'JUSTID'
    rcall('XCLAIM', unpack(args))
  else
    if ARGV[3] == 'requeue' then
      for _, id in ipairs(mine) do
        local entry = rcall('XRANGE', KEYS[1], id, id)[1]
        if entry then rcall('XADD', KEYS[1], '*', unpack(entry[2])) end
      end
    end
    rcall('XACK', KEYS[1], ARGV[1], unpack(mine))
  end
end
return (#ARGV - 3) - #mine
