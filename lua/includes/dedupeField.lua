-- The dedupe field of a caller's event id (spec 2.4: unique per subscriber): the tenant, the byte
-- length of the externalId, the externalId and the caller's id. The length keeps it unambiguous:
-- both ids may hold `|`, and without it externalId `a|b` with id `c` and externalId `a` with id
-- `b|c` (in one partition) shared a field, so one subscriber's event was dropped as a duplicate of
-- the other's.
local function dedupeField(tenant, externalId, callerId)
  return tenant .. '|' .. #externalId .. '|' .. externalId .. '|' .. callerId
end
