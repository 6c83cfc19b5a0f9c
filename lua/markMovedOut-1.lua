--[[
  Marks a subscriber's copy of a subscription as moved out under a move's claim number, before the
  mover reads that copy and writes its own (streams/subscriptions.ts `markMovedOut`): a registration
  of that subscriber claimed before the move and not written yet then writes nothing (its write
  guards on the mark), whether or not a copy is there now. The highest claim number stays.

  KEYS[1] the marks of the subscription in the subscriber's partition ({pN}:scr-out:<tenant>:<subscriptionId>),
          field externalId -> claim number

  ARGV[1] externalId, ARGV[2] the move's claim number, ARGV[3] when the marks expire (ms since the epoch)
]]
local rcall = redis.call
if tonumber(rcall('HGET', KEYS[1], ARGV[1]) or '0') < tonumber(ARGV[2]) then rcall('HSET', KEYS[1], ARGV[1], ARGV[2]) end
rcall('PEXPIREAT', KEYS[1], ARGV[3])
return 1
