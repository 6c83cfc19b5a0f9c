--[[
  Marks a message's fan-out done (and its audience cursor, so a later claim walks nothing again);
  completes the message at once when no delivery is pending.

  KEYS[1] the message record ({t}:msg:<id>)

  ARGV[1] tenant key base ({t} with the key prefix)
  ARGV[2] message id
  ARGV[3] now (ISO 8601)

  Returns the message status afterwards.
]]
-- @include "completeWhenSettled"
local rcall = redis.call
local base, msg = ARGV[1], ARGV[2]
rcall('HSET', KEYS[1], 'fanout', 'done', 'cursor', 'done', 'updatedAt', ARGV[3])
return completeWhenSettled(KEYS[1], base, msg, ARGV[3])
