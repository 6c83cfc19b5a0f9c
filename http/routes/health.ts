import type { RoutesBySegment as Router } from '../routes-by-segment.js';
import { now } from '../../lib/clock.js';
import { VERSION } from '../../lib/version.js';
import { liveRoles } from '../../streams/heartbeat.js';
import type { AppDeps } from '../deps.js';
import { respond } from '../envelope.js';

const startedAt = now();

export function registerHealth(router: Router, deps: AppDeps): void {
  /**
   * @openapi
   * /v1/health:
   *   get:
   *     operationId: getHealth
   *     summary: Service health
   *     description: No credential. Redis reachability and round-trip latency, version, and live processes per role.
   *       Answers 200 with status `degraded` (and 503) when Redis does not answer.
   *     tags: [Health]
   *     security: []
   *     responses:
   *       '200':
   *         description: Healthy
   *         content: { application/json: { schema: { $ref: '#/components/schemas/HealthResponse' } } }
   *       '503':
   *         description: Redis unreachable
   *         content: { application/json: { schema: { $ref: '#/components/schemas/HealthResponse' } } }
   */
  router.get('/v1/health', async (ctx) => {
    const started = process.hrtime.bigint();
    let reachable = true;
    let roles: Record<string, number> = {};
    try {
      await Promise.race([deps.redis.ping(), new Promise((_, fail) => setTimeout(() => fail(new Error('timeout')), 1_000).unref())]);
      roles = await liveRoles(deps.redis, deps.keys);
    } catch {
      reachable = false;
    }
    const latencyMs = reachable ? Number(process.hrtime.bigint() - started) / 1e6 : null;
    respond(ctx, reachable ? 200 : 503, {
      status: reachable ? 'ok' : 'degraded',
      version: VERSION,
      redis: { reachable, latencyMs: latencyMs === null ? null : Math.round(latencyMs * 1000) / 1000 },
      roles,
      uptimeSeconds: Math.floor((now() - startedAt) / 1000),
    });
  });
}
