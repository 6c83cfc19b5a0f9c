--[[
  Creates a webhook endpoint unless the workspace already has the most allowed.

  KEYS[1] the workspace's endpoint index   ({w:<ws>}:whks)   zset (score 0) of endpoint ids
  KEYS[2] the new endpoint's record        ({w:<ws>}:whk:<id>) hash
  KEYS[3] the endpoints' version counter   ({w:<ws>}:whks:v)

  ARGV[1] endpoint id
  ARGV[2] most endpoints per workspace (50)
  ARGV[3..] field, value pairs of the record

  Returns 1 when created, 0 when the workspace is at its limit (nothing written).
]]
local rcall = redis.call
if rcall('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
local fields = {}
for i = 3, #ARGV do fields[#fields + 1] = ARGV[i] end
rcall('HSET', KEYS[2], unpack(fields))
rcall('ZADD', KEYS[1], 0, ARGV[1])
rcall('INCR', KEYS[3])
return 1
