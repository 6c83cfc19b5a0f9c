-- A record as HGETALL lists it, without its secrets (`secret`, `retiredSecrets`, `previousSecret`):
-- what a script answers for a record whose secrets live in the record alone (its reply is also kept
-- with its audit intent in an outbox, lua/includes/recordAudit, until the entry is settled).
local function withoutSecrets(list)
  local out = {}
  for i = 1, #list, 2 do
    local field = list[i]
    if field ~= 'secret' and field ~= 'retiredSecrets' and field ~= 'previousSecret' then
      out[#out + 1] = field
      out[#out + 1] = list[i + 1]
    end
  end
  return out
end
