--[[
  Fires a partition's due timers: each due member is removed from the timer set and appended to
  the partition's timer inbox as a timer entry, in one atomic call, so a timer fires once even when
  the scheduler dies (either both happened or neither). The subscriber actors read the timer inbox
  beside the event inbox, so a due timer does not wait behind the event backlog; one whose
  subscriber still has events waiting that must come first is moved to the event inbox
  (actors/timer-order.ts). The actor ignores a timer its state no longer waits for.

  KEYS[1] timers          ({pN}:timers, member `<kind>|<workspaceId>|<tenantId>|<ref>|<externalId>`)
  KEYS[2] timer inbox     ({pN}:tin)

  ARGV[1] now (ms)        ARGV[2] at most this many timers

  Returns the number of timers fired.
]]
local rcall = redis.call
local due = rcall('ZRANGE', KEYS[1], '-inf', ARGV[1], 'BYSCORE', 'LIMIT', 0, tonumber(ARGV[2]))
for _, member in ipairs(due) do
  local kind, workspace, tenant, ref, externalId = string.match(member, '^([^|]*)|([^|]*)|([^|]*)|([^|]*)|(.*)$')
  if kind then
    rcall('XADD', KEYS[2], '*', 'k', 'timer', 't', tenant, 'w', workspace, 'x', externalId, 'tm', member)
  end
  rcall('ZREM', KEYS[1], member)
end
return #due
