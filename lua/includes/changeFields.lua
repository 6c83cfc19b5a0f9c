-- Writes the field changes of a PATCH to the hash `key`: `count` groups of 2 of ARGV from `from`
-- (field, value; '' removes the field). A value equal to the stored one is no change. `set(field,
-- value)` writes a changed value when given (a field with more to do than HSET), else HSET does.
-- Returns whether anything changed.
local function changeFields(key, from, count, set)
  local changed = false
  for i = 0, count - 1 do
    local field, value = ARGV[from + i * 2], ARGV[from + 1 + i * 2]
    local current = redis.call('HGET', key, field)
    if value == '' then
      if current then
        redis.call('HDEL', key, field)
        changed = true
      end
    elseif current ~= value then
      if set then set(field, value) else redis.call('HSET', key, field, value) end
      changed = true
    end
  end
  return changed
end
