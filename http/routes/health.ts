import type { RoutesBySegment as Router } from '../routes-by-segment.js';
import { now } from '../../lib/clock.js';
import { ROLES } from '../../lib/config.js';
import { VERSION } from '../../lib/version.js';
import { liveRoles } from '../../streams/heartbeat.js';
import type { AppDeps } from '../deps.js';
import { ApiError } from '../../lib/errors.js';
import { respond } from '../envelope.js';

const startedAt = now();

export function registerHealth(router: Router, deps: AppDeps): void {
  /**
   * @openapi
   * /v1/health:
   *   get:
   *     operationId: getHealth
   *     summary: Service health
   *     description: No credential. Redis reachability and round-trip latency, version, and live processes per role
   *       (every role listed, 0 when none has announced itself in the last 15 seconds).
   *       Status `ok` when Redis answers and takes writes and every role has a live process; `degraded` (still 200)
   *       when Redis refuses writes (`redis.writable` false, as when its memory is full, its snapshots fail or it is
   *       a replica; writes are then answered 503; or does not take one within 1 s, as when it pauses writes) or a role has none (with no worker, events are accepted but not processed; with no
   *       dispatcher nothing is delivered);
   *       When Redis does not answer, 503 `unavailable` in the error envelope (`success` false, `data` null, spec 2.1).
   *     tags: [Health]
   *     security: []
   *     responses:
   *       '200':
   *         description: Healthy
   *         content: { application/json: { schema: { $ref: '#/components/schemas/HealthResponse' } } }
   *       '503': { $ref: '#/components/responses/Unavailable' }
   */
  router.get('/v1/health', async (ctx) => {
    const started = process.hrtime.bigint();
    let reachable = true;
    let writeError: string | null = null;
    const roles: Record<string, number> = Object.fromEntries(ROLES.map((role) => [role, 0]));
    try {
      await within(deps.redis.ping(), 1_000);
      Object.assign(roles, await liveRoles(deps.redis, deps.keys));
    } catch {
      reachable = false;
    }
    const latencyMs = Number(process.hrtime.bigint() - started) / 1e6;
    // a Redis that answers but refuses writes (memory full, probe X) stops every role's heartbeat too:
    // say why, so an operator does not restart healthy processes
    if (reachable) {
      try {
        // bounded as the ping: a Redis pausing writes held the answer for the command timeout (5 s, probe G)
        await within(deps.redis.set(deps.keys.healthProbe, String(now()), 'PX', 60_000), 1_000);
      } catch (err) {
        writeError = (err as Error).message;
      }
    }
    // an error like any other (spec 2.1: success false, data null); clients retry a 5xx (Part 7)
    if (!reachable) throw new ApiError(503, 'unavailable', 'Redis does not answer within 1 s: the service cannot take or process requests; retry later');
    const everyRole = ROLES.every((role) => roles[role]! > 0);
    respond(ctx, 200, {
      status: everyRole && writeError === null ? 'ok' : 'degraded',
      version: VERSION,
      redis: { reachable, latencyMs: Math.round(latencyMs * 1000) / 1000, writable: writeError === null, writeError },
      roles,
      uptimeSeconds: Math.floor((now() - startedAt) / 1000),
    });
  });
}

/** `work`, or a rejection naming the time when it has not settled within `ms`. */
function within<T>(work: Promise<T>, ms: number): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, fail) => (timer = setTimeout(() => fail(new Error(`no answer within ${ms} ms`)), ms)));
  return Promise.race([work, late]).finally(() => clearTimeout(timer));
}
