-- The dedupe field of a caller's event id (spec 2.4: unique per subscriber): the tenant, the byte
-- length of the externalId, the externalId and the caller's id. The length keeps it unambiguous:
-- both ids may hold `|`, and without it externalId `a|b` with id `c` and externalId `a` with id
-- `b|c` (in one partition) shared a field, so one subscriber's event was dropped as a duplicate of
-- the other's. The engine's own events (source `system`, which no caller can send: `$send` once
-- per message) have their ids in a namespace of their own, `#` in place of the last `|`, so a
-- caller's id can never match one (nor suppress it). A Source's deliveries (source `webhook`)
-- have theirs after `!`, so a backend's own ids cannot match them either.
local function dedupeField(tenant, externalId, callerId, source)
  return tenant .. '|' .. #externalId .. '|' .. externalId .. (source == 'system' and '#' or source == 'webhook' and '!' or '|') .. callerId
end
