-- Appends one event to a partition inbox with every field the subscriber actor reads
-- (see INBOX_FIELDS in actors/subscriber-actor.ts). Always writes every field, so the stream's
-- entries share one field list and Redis stores the names once. `tc`: the tenant's ordinal in the
-- partition (lua/ingestEvents), '' for the entries other scripts append (not counted in its backlog).
local function appendInboxEvent(inbox, e)
  return redis.call('XADD', inbox, '*', 't', e.t, 'w', e.w, 'id', e.id, 'q', e.q, 'x', e.x, 'u', e.u,
    'n', e.n, 'o', e.o, 'ts', e.ts, 'r', e.r, 'd', e.d, 'c', e.c or '', 'ru', e.ru or '', 'm', e.m or '', 'st', e.st or '', 'pv', e.pv or '', 'tc', e.tc or '')
end
