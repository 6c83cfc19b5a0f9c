--[[
  Records since which definitions version each kept event condition has been kept without a break,
  so a counter seeded before a break (its condition dropped, then kept again) is known to be stale:
  while the condition was not kept, the actors counted none of its events.

  Each process that loads a tenant's definitions notes what it loaded; only a newer version than the
  one recorded changes the record, so a process with an older copy never undoes a newer one. Versions
  no process loaded leave no trace, and need none: no event was handled under them.

  KEYS[1] the tenant's kept-conditions record (JSON { v, since: { <conditionKey>: <version> } })
  ARGV[1] the definitions version loaded (an integer)
  ARGV[2] JSON array of the condition keys that version keeps

  Returns the record's `since` as JSON: for each key kept at the recorded version, the version from
  which it has been kept. A tenant's first record dates every key from 0: what was kept before
  records existed counts as kept all along.
]]
local v = tonumber(ARGV[1])
local kept = cjson.decode(ARGV[2])
local raw = redis.call('GET', KEYS[1])
local stored = raw and cjson.decode(raw) or nil
if stored and stored.v >= v then return cjson.encode(stored.since) end
local since = {} -- an empty table encodes as {}
for _, key in ipairs(kept) do
  local from = 0
  if stored then from = stored.since[key] or v end
  since[key] = from
end
local record = { v = v, since = since }
redis.call('SET', KEYS[1], cjson.encode(record))
return cjson.encode(record.since)
