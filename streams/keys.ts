/**
 * The one key-name builder. Every Redis key the service touches is named here.
 *
 * Hash tags keep each atomic script on one slot: `{w:<workspaceId>}` for workspace keys,
 * `{t:<tenantId>}` for tenant-wide keys, `{pN}` for a subscriber partition. Keys without a
 * tag are global lookups that no script combines with another key.
 */
export type Keys = ReturnType<typeof createKeys>;

/** The two fan-out queues of a tenant: messages to one subscriber, and messages to an audience (topic, segment, where). */
export type MessageLane = 'one' | 'audience';

export function createKeys(prefix: string) {
  const w = (workspaceId: string) => `${prefix}{w:${workspaceId}}`;
  const t = (tenantId: string) => `${prefix}{t:${tenantId}}`;
  const p = (partition: number) => `${prefix}{p${partition}}`;
  return {
    prefix,
    /** hash slug → workspace id */
    workspaceSlugs: `${prefix}workspaces:by-slug`,
    /** hash: the workspace record */
    workspace: (workspaceId: string) => `${w(workspaceId)}:workspace`,
    /** hash tenant slug → tenant id */
    tenantSlugs: (workspaceId: string) => `${w(workspaceId)}:tenants:by-slug`,
    /** zset of tenant ids by creation time */
    tenantIndex: (workspaceId: string) => `${w(workspaceId)}:tenants`,
    /** hash: a tenant record (holds its workspace id), beside its workspace so one script creates both */
    tenant: (workspaceId: string, tenantId: string) => `${w(workspaceId)}:tenant:${tenantId}`,
    /** hash: an API key record (never the key itself, only its SHA-256) */
    apiKey: (keyId: string) => `${prefix}key:${keyId}`,
    /** string: key id of the key whose SHA-256 is `hash` */
    apiKeyByHash: (hash: string) => `${prefix}key-hash:${hash}`,
    /** zset of a workspace's key ids by creation time */
    apiKeyIndex: (workspaceId: string) => `${w(workspaceId)}:keys`,
    /** pub/sub channel announcing revoked key hashes to every process */
    keyRevocations: `${prefix}channel:key-revocations`,
    /**
     * hash intent token → pending audit intent, one per hash slot (streams/audit-outbox.ts): the
     * workspace's, a tenant's or a partition's, beside the records its writes change
     */
    workspaceOutbox: (workspaceId: string) => `${w(workspaceId)}:outbox`,
    tenantOutbox: (tenantId: string) => `${t(tenantId)}:outbox`,
    partitionOutbox: (n: number) => `${p(n)}:outbox`,
    /**
     * hash `<tenantId>|<sub_ id>` → the tenant-wide cleanup a subscriber delete still owes (JSON,
     * streams/subscriber-cleanup.ts), written by the delete's own write in the subscriber's partition
     * and removed once its token index entries, widgets and topic member entries are gone
     */
    subscriberCleanups: (n: number) => `${p(n)}:cleanups`,
    /**
     * hash `<tenantId>|<topicId>|<nonce>` → a topic membership change written in this partition whose
     * copy in the topic's member set may not be written yet (JSON, streams/topic-members.ts
     * `TopicMirror`), recorded by the membership write itself and removed once the member set mirrors it
     */
    topicMirrors: (n: number) => `${p(n)}:topic-mirrors`,
    /**
     * hash `<tenantId>|<scr_ id>|<claim>` → a subscription removed in this partition whose token index
     * entry may not be released yet (JSON, streams/subscriptions.ts `TokenRelease`), recorded by the
     * removal's own write and removed once lua/releaseToken ran
     */
    tokenReleases: (n: number) => `${p(n)}:token-releases`,
    runSends: (n: number) => `${p(n)}:run-sends`,
    /** stream: the workspace ledger (audit events and subscriber stream events) */
    ledger: (workspaceId: string) => `${w(workspaceId)}:ledger`,
    // --- outbound webhooks (issue 7): lua/*Webhook*.lua build the per-endpoint and per-delivery names
    // below from `webhookBase` with the same suffixes ---
    /** zset (score 0) of workspace ids with webhook endpoints: the ledgers the dispatchers read */
    webhookWorkspaces: `${prefix}webhooks:workspaces`,
    /**
     * set of workspace ids that ever had a webhook endpoint (added before the endpoint is created,
     * never removed): the workers forward stream events to these workspaces' ledgers only
     */
    webhookForwarding: `${prefix}webhooks:forwarding`,
    /** the workspace tag with the prefix, from which the webhook scripts build the names below */
    webhookBase: (workspaceId: string) => w(workspaceId),
    /** zset (score 0) of a workspace's webhook endpoint ids, by creation */
    webhookEndpoints: (workspaceId: string) => `${w(workspaceId)}:whks`,
    /** string: bumped on every endpoint change, so dispatchers reload their copy of the endpoints */
    webhookVersion: (workspaceId: string) => `${w(workspaceId)}:whks:v`,
    /** hash endpoint id → disabledAt: endpoints the failure streak disabled whose `webhook.disabled` audit event is not in the ledger yet */
    webhookUnannounced: (workspaceId: string) => `${w(workspaceId)}:whks:unannounced`,
    /** hash endpoint id → re-enable time (ms): re-enabled endpoints whose pending and failed deliveries are still to be re-queued */
    webhookRequeues: (workspaceId: string) => `${w(workspaceId)}:whks:requeue`,
    /** hash: a webhook endpoint (url, patterns, secrets, enabled, activeSince, failingSince) */
    webhookEndpoint: (workspaceId: string, endpointId: string) => `${w(workspaceId)}:whk:${endpointId}`,
    /** zset of an endpoint's delivery ids scored by createdAt (streams/scored-index.ts); with `status`, those in that status */
    webhookDeliveries: (workspaceId: string, endpointId: string, status?: string) => `${w(workspaceId)}:whk:${endpointId}:dlv${status ? `:${status}` : ''}`,
    /**
     * zset: a deleted endpoint's delivery index (its `dlv` renamed by lua/deleteWebhookEndpoint, same
     * scores), whose records and payloads the dispatchers' sweep removes a batch at a time (lua/purgeWebhookDeliveries)
     */
    webhookPurge: (workspaceId: string, endpointId: string) => `${w(workspaceId)}:whk:${endpointId}:purge`,
    /** set of deleted endpoint ids whose `webhookPurge` index is not walked to the end yet */
    webhookPurges: (workspaceId: string) => `${w(workspaceId)}:whks:purge`,
    /** zset attempt member (`<whd_ id>` or `<whd_ id>#<replay n>`) → due ms: an endpoint's waiting attempts */
    webhookDue: (workspaceId: string, endpointId: string) => `${w(workspaceId)}:whk:${endpointId}:due`,
    /** hash: one delivery of one event to one endpoint (status, counters, attempts `a:<n>`) */
    webhookDelivery: (workspaceId: string, deliveryId: string) => `${w(workspaceId)}:whd:${deliveryId}`,
    /** string: the payload of a delivered event (JSON, built once, immutable), for the retention */
    webhookEvent: (workspaceId: string, eventId: string) => `${w(workspaceId)}:whe:${eventId}`,
    /** zset attempt member → lease expiry ms: attempts a dispatcher has claimed and not recorded */
    webhookInflight: (workspaceId: string) => `${w(workspaceId)}:whd-inflight`,
    /** hash attempt member → claim token of its current lease */
    webhookLeases: (workspaceId: string) => `${w(workspaceId)}:whd-leases`,
    /** string written by `GET /v1/health` (expires in a minute): whether Redis takes writes */
    healthProbe: `${prefix}health-probe`,
    /** hash `<role>:<host>:<pid>` → last heartbeat (ms) of every running process */
    processes: `${prefix}processes`,
    /** string: the deployment's HERALD_PARTITIONS, set by the first process to start */
    partitionCount: `${prefix}partitions`,
    // --- partition keys: everything of one subscriber and its partition shares the tag {pN} ---
    /** stream: the partition inbox every event of its subscribers is appended to */
    inbox: (n: number) => `${p(n)}:in`,
    /** stream: the partition's fired timers (lua/fireTimers), read by the actors beside the inbox so a due timer does not wait behind its backlog (actors/timer-order.ts) */
    timerInbox: (n: number) => `${p(n)}:tin`,
    /** hash `tenant|externalId` → last sequence issued */
    sequences: (n: number) => `${p(n)}:seq`,
    /** hash `tenant|externalId` → sub_ id (the subscriber exists) */
    subscribers: (n: number) => `${p(n)}:subs`,
    /** hash `tenant|<externalId byte length>|externalId|callerId` (`#` in place of the last `|` for the engine's own ids, source `system`: lua/includes/dedupeField) → where the original event is: `i<inbox id>`, then `l<tenant-log id>` once applied (dedupe of the caller's ids) */
    dedupe: (n: number) => `${p(n)}:dedupe`,
    /** zset dedupe field → receivedAt ms, to expire dedupe entries with the retention */
    dedupeAge: (n: number) => `${p(n)}:dedupe-age`,
    /**
     * hash of each tenant's place in this partition's inbox: `i|<tenant>` → ordinal of the tenant's
     * last event ingested here (lua/ingestEvents stamps it on the entry as `tc`), `d|<tenant>` → the
     * highest ordinal the worker has processed (lua/applyEvents); their difference is the tenant's
     * unprocessed events here, held under `TENANT_INBOX_MAX_BACKLOG` by streams/ingest.ts
     */
    tenantBacklog: (n: number) => `${p(n)}:backlog`,
    /** hash `tenant|externalId` → last sequence the subscriber actor applied */
    applied: (n: number) => `${p(n)}:applied`,
    /** zset `tenant|externalId` → ms of its deletion: deleted subscribers whose sequences and automation state the retention sweeper forgets (lua/forgetDeletedSubscribers) */
    deletedSubscribers: (n: number) => `${p(n)}:gone`,
    /** string: id of the worker holding the partition's lease (with expiry) */
    lease: (n: number, group: string) => `${p(n)}:lease:${group}`,
    /**
     * Read-model keys, written by lua/applyEvents-4.lua (which builds the same names from
     * `partitionBase`) and read by streams/read-models.ts.
     */
    partitionBase: (n: number) => p(n),
    /** stream: a tenant's events in this partition (the tenant log, merged across partitions on read) */
    tenantLog: (n: number, tenantId: string) => `${p(n)}:log:${tenantId}`,
    /** zset: one subscriber's timeline, member = tenant-log entry id (receivedAt ms first), score = sequence */
    timeline: (n: number, tenantId: string, externalId: string) => `${p(n)}:tl:${tenantId}:${externalId}`,
    /** hash: a tenant's catalog in this partition (`<name>|all`, `|first`, `|last`, `|src:<s>`, `|prv:<p>`) */
    catalog: (n: number, tenantId: string) => `${p(n)}:cat:${tenantId}`,
    /** hash name → count (`*` for all names) of one hour or day bucket */
    volume: (n: number, tenantId: string, unit: 'h' | 'd', bucketMs: number) => `${p(n)}:vol:${tenantId}:${unit}:${bucketMs}`,
    /** HyperLogLog of the subscribers of one bucket and name (`*` for all names) */
    uniques: (n: number, tenantId: string, unit: 'h' | 'd', bucketMs: number, name: string) => `${p(n)}:uv:${tenantId}:${unit}:${bucketMs}:${name}`,
    /** list: tenant-log entry ids of the newest samples of a name */
    samples: (n: number, tenantId: string, name: string) => `${p(n)}:smp:${tenantId}:${name}`,
    // lua/readAudience and lua/loadStates build the subscriber, subscription, subscriber-topics and
    // automation names below from `partitionBase` with these same suffixes
    /** hash: a subscriber's record (attributes, preferences, version `v`); lua/includes/ensureSubscriber creates it */
    subscriber: (n: number, tenantId: string, externalId: string) => `${p(n)}:sub:${tenantId}:${externalId}`,
    /** zset (score 0) of `<sub_ id>|<externalId>`: the tenant's subscribers in this partition, by creation */
    subscriberIndex: (n: number, tenantId: string) => `${p(n)}:subidx:${tenantId}`,
    /** zset (score 0) of `<sub_ id>|<externalId>` of the tenant's subscribers with this email (lowercased) in this partition */
    subscriberEmailIndex: (n: number, tenantId: string, email: string) => `${p(n)}:subidx-email:${tenantId}:${email}`,
    /** zset (score 0) of `<sub_ id>|<externalId>` of the tenant's verified subscribers in this partition */
    subscriberVerifiedIndex: (n: number, tenantId: string) => `${p(n)}:subidx-verified:${tenantId}`,
    /** hash: one subscription (device or address) of a subscriber */
    subscription: (n: number, tenantId: string, subscriptionId: string) => `${p(n)}:scr:${tenantId}:${subscriptionId}`,
    /** hash: `claim` → the claim number of the move that removed this subscriber partition's copy of a
     *  subscription (expires after MOVED_OUT_KEEP_MS): an older registration writes no copy after it */
    subscriptionMovedOut: (n: number, tenantId: string, subscriptionId: string) => `${p(n)}:scr-out:${tenantId}:${subscriptionId}`,
    /** set of a subscriber's subscription ids */
    subscriberSubscriptions: (n: number, tenantId: string, externalId: string) => `${p(n)}:sub-scrs:${tenantId}:${externalId}`,
    /** set of the topic ids a subscriber belongs to */
    subscriberTopics: (n: number, tenantId: string, externalId: string) => `${p(n)}:sub-topics:${tenantId}:${externalId}`,
    // --- segments and workflows (issue 8): a subscriber's automation state lives in its partition ---
    /** hash: a subscriber's automation state: `v` (version, compare-and-set), `seq` (last sequence the
     *  automation step handled), `segs` (JSON array of segment ids it belongs to), `runs` (JSON array of
     *  its active run ids), `win` (due ms of its armed segment-window timer, '' when none), `ea`/`eb`/`er` (its engine
     *  range: sequences lua/commitAutomation issued with nothing else between them, all of run `er`
     *  or '', see actors/timer-order.ts); and its
     *  time-bucketed event counters, `<condition key>|<bucket start ms>` (or `|all`) → count, with
     *  `<condition key>|init` → 1 once the counter was seeded from the timeline (fields with a `|`) */
    automation: (n: number, tenantId: string, externalId: string) => `${p(n)}:auto:${tenantId}:${externalId}`,
    /** zset (score 0) of a segment's members in this partition, `<sub_ id>|<externalId>` (streams/subscriber-list.ts `indexMember`) */
    segmentMembers: (n: number, tenantId: string, segmentId: string) => `${p(n)}:segm:${tenantId}:${segmentId}`,
    /**
     * zset `<tenantId>|<segmentId>` → ms of the deletion: segments deleted in the last
     * DELETED_SEGMENT_KEEP_MS, of which lua/commitAutomation adds no member (streams/segments.ts
     * `dropSegmentMembers`, `sweepDeletedSegments`)
     */
    deletedSegments: (n: number) => `${p(n)}:segs-gone`,
    /** zset: a deleted segment's members in this partition (its member set renamed), whose `segs` may still name it */
    deletedSegmentMembers: (n: number, tenantId: string, segmentId: string) => `${p(n)}:segm-gone:${tenantId}:${segmentId}`,
    /** set of `<tenantId>|<segmentId>` whose gone-members set in this partition is left to visit */
    deletedSegmentVisits: (n: number) => `${p(n)}:segs-gone:visit`,
    /** hash: a workflow run (see streams/workflow-runs.ts for the fields) */
    run: (n: number, tenantId: string, runId: string) => `${p(n)}:run:${tenantId}:${runId}`,
    /** zset (score 0) of a workflow's run ids in this partition; with `status`, those in that status */
    workflowRuns: (n: number, tenantId: string, workflowId: string, status?: string) => `${p(n)}:wfr:${tenantId}:${workflowId}${status ? `:${status}` : ''}`,
    /** zset `<tenantId>|<runId>` → the ms the run ended (completed, canceled, failed): what the retention sweep expires (lua/expireRuns) */
    runsEnded: (n: number) => `${p(n)}:runs-ended`,
    /** zset timer member → due ms: the partition's timers, fired by the scheduler role
     *  (member `<kind>|<workspaceId>|<tenantId>|<ref>|<externalId>`) */
    timers: (n: number) => `${p(n)}:timers`,
    /** scheduled messages' release times spread over the partitions (member `<tenantId>|<messageId>`, score sendAt ms; streams/messages.ts) */
    messageTimers: (n: number) => `${p(n)}:msg-timers`,
    /** zset of tenant ids with data in this partition (retention sweeps walk it) */
    partitionTenants: (n: number) => `${p(n)}:tenants`,
    /** zset of live members of a leasing group (`worker`, `scheduler`), score = last heartbeat ms */
    leaseMembers: (group: string) => `${prefix}lease-members:${group}`,
    /** string: the secret signing events tokens, generated once per deployment */
    eventsTokenSecret: `${prefix}secret:events-token`,
    // --- tenant keys ---
    /** hash push token or address → `<subscription id>|<externalId>[|<previous externalId while moving>]` */
    /** list: the catalog's names after a first page, in its order then (streams/catalog-order.ts), 10 minutes */
    catalogOrder: (tenantId: string, id: string) => `${t(tenantId)}:cat-order:${id}`,
    /** zset id → ms: the tenant's kept catalog orders, at most 20 */
    catalogOrders: (tenantId: string) => `${t(tenantId)}:cat-orders`,
    tokens: (tenantId: string) => `${t(tenantId)}:tokens`,
    /** hash push token or address → previous externalId, while a token moving between subscribers is not settled */
    tokenMoves: (tenantId: string) => `${t(tenantId)}:token-moves`,
    /** hash subscription id → externalId of its subscriber */
    subscriptionOwners: (tenantId: string) => `${t(tenantId)}:scr-owner`,
    /** string: the lock of one registration of a push token or address at a time (`field` its token field, lua/claimToken) */
    tokenLock: (tenantId: string, field: string) => `${t(tenantId)}:token-lock:${field}`,
    /** hash subscription id → number of the latest claim of its token (lua/claimToken); fences the removal of a moved copy */
    subscriptionClaims: (tenantId: string) => `${t(tenantId)}:scr-claims`,
    /** hash: a topic record */
    topic: (tenantId: string, topicId: string) => `${t(tenantId)}:topic:${topicId}`,
    /** zset (score 0) of topic ids, by creation */
    topicIndex: (tenantId: string) => `${t(tenantId)}:topics`,
    /** hash topic slug → topic id */
    topicSlugs: (tenantId: string) => `${t(tenantId)}:topics:by-slug`,
    /** zset externalId → join time (ms × 1000 + position in the call), the topic's members */
    topicMembers: (tenantId: string, topicId: string) => `${t(tenantId)}:topic-members:${topicId}`,
    /** zset: a deleted topic's members (its member set renamed), whose own topic sets still name it (streams/topic-members.ts `sweepDeletedTopics`) */
    deletedTopicMembers: (tenantId: string, topicId: string) => `${t(tenantId)}:topic-members-gone:${topicId}`,
    /** set of the tenant's deleted topic ids with members left to visit */
    deletedTopics: (tenantId: string) => `${t(tenantId)}:topics-gone`,
    /** hash: a client widget (lua/*Widget*.lua build the same name from `tenantBase`) */
    widget: (tenantId: string, widgetId: string) => `${t(tenantId)}:widget:${widgetId}`,
    /** zset (score 0) of a subscriber's widget ids */
    subscriberWidgets: (tenantId: string, externalId: string) => `${t(tenantId)}:sub-widgets:${externalId}`,
    /** hash: the tenant's APNs app credentials (key id, team id, bundle id, private key sealed by lib/secret-box, version) */
    apnsCredentials: (tenantId: string) => `${t(tenantId)}:apns`,
    /** hash Idempotency-Key → `<message id>|<sha256 of the request>`; never expires */
    idempotency: (tenantId: string) => `${t(tenantId)}:idem`,
    /** hash: a message record (content, target, counts `n:<status>`, fan-out cursor); lua/startFanout, createDeliveries and settleDeliveries build it from `tenantBase` for a batch of messages */
    message: (tenantId: string, messageId: string) => `${t(tenantId)}:msg:${messageId}`,
    /** zset (score 0) of message ids; `messagesByStatus` per status */
    messageIndex: (tenantId: string) => `${t(tenantId)}:messages`,
    messagesByStatus: (tenantId: string, status: string) => `${t(tenantId)}:messages:${status}`,
    /**
     * stream of messages ready for fan-out (consumer group `fanout` of the dispatchers), one per lane:
     * `one` (to one subscriber) `{t}:msgq`, `audience` (topic, segment, where) `{t}:msgq:audience`
     * (lua/moveMessage builds both names from the tenant base)
     */
    messageQueue: (tenantId: string, lane: MessageLane) => `${t(tenantId)}:msgq${lane === 'audience' ? ':audience' : ''}`,
    /** zset message id → the ms it ended (completed, canceled, failed; lua/includes/setMessageStatus): what the retention sweep expires (lua/expireMessages) */
    messagesEnded: (tenantId: string) => `${t(tenantId)}:msg-ended`,
    /** zset message id → sendAt ms of scheduled messages */
    messageDue: (tenantId: string) => `${t(tenantId)}:msg-due`,
    /** hash: one delivery of a message to one subscription */
    delivery: (tenantId: string, deliveryId: string) => `${t(tenantId)}:dlv:${deliveryId}`,
    /** zset of a message's delivery ids scored by creation (streams/scored-index.ts; 0 for those made before session 55); `messageDeliveriesByStatus` per status */
    messageDeliveries: (tenantId: string, messageId: string) => `${t(tenantId)}:msg-dlv:${messageId}`,
    messageDeliveriesByStatus: (tenantId: string, messageId: string, status: string) => `${t(tenantId)}:msg-dlv:${messageId}:${status}`,
    /** zset of `<tenantId>|<workspaceId>` of every tenant that ever sent a message: the dispatchers read their queues */
    messageTenants: `${prefix}message-tenants`,
    /** string: bumped on every segment or workflow change, so workers reload their copy of the definitions */
    automationVersion: (tenantId: string) => `${t(tenantId)}:auto:v`,
    /** string (JSON): since which automationVersion each kept event condition has been kept without a break (lua/noteKeptConditions) */
    keptConditions: (tenantId: string) => `${t(tenantId)}:auto:kept`,
    /** hash: a segment (slug, name, description, where JSON, backfill progress) */
    segment: (tenantId: string, segmentId: string) => `${t(tenantId)}:seg:${segmentId}`,
    /** zset (score 0) of segment ids, by creation */
    segmentIndex: (tenantId: string) => `${t(tenantId)}:segs`,
    /** hash segment slug → segment id */
    segmentSlugs: (tenantId: string) => `${t(tenantId)}:segs:by-slug`,
    /** zset (score 0) of `<tenantId>|<workspaceId>|<segmentId>` of segments whose backfill is not finished */
    segmentBackfills: `${prefix}segment-backfills`,
    /** hash: a workflow (slug, name, description, enabled, current version number and id) */
    workflow: (tenantId: string, workflowId: string) => `${t(tenantId)}:wfl:${workflowId}`,
    /** zset (score 0) of workflow ids, by creation */
    workflowIndex: (tenantId: string) => `${t(tenantId)}:wfls`,
    /** hash workflow slug → workflow id */
    workflowSlugs: (tenantId: string) => `${t(tenantId)}:wfls:by-slug`,
    /** hash: one immutable version of a workflow (id, workflowId, version, definition JSON, createdAt) */
    workflowVersion: (tenantId: string, versionId: string) => `${t(tenantId)}:wfv:${versionId}`,
    /** zset version number → version id, of a workflow's versions */
    workflowVersions: (tenantId: string, workflowId: string) => `${t(tenantId)}:wfl:${workflowId}:versions`,
    /** zset event name → deletion ms: the `wait` and `cancelOn` names of deleted workflows, still watched for their runs */
    workflowGoneNames: (tenantId: string) => `${t(tenantId)}:wfls:gone-names`,
    // --- sources: other services' webhooks turned into events ---
    /** hash: a source (provider, format, mapping, secrets, enabled, inbound counts `n:<status>`, last error) */
    source: (tenantId: string, sourceId: string) => `${t(tenantId)}:src:${sourceId}`,
    /** zset (score 0) of a tenant's source ids, by creation */
    sourceIndex: (tenantId: string) => `${t(tenantId)}:srcs`,
    /**
     * hash source id → `<workspaceId>|<tenantId>`: where an inbound request (which carries no API key)
     * finds its source; set before the source is created, removed after it is deleted
     */
    sourceRoutes: `${prefix}sources:by-id`,
    /** string: a short lock so one process of a role does a periodic job */
    lock: (name: string) => `${prefix}lock:${name}`,
    /** the tenant tag with the prefix: Lua scripts build message and delivery key names from it as above */
    tenantBase: (tenantId: string) => t(tenantId),
    tenantTag: t,
  };
}
