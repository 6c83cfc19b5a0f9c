/**
 * How many times longer than asked a `waitFor` goes on before it fails (`TEST_WAIT_SCALE`, default 3).
 * A wait ends as soon as its condition holds, so the scale costs a passing run nothing; it keeps a
 * slow or loaded machine (CI's shards share two cores with every role process they start) from
 * failing a test whose condition was merely late. No test measures speed with a wait: figures live in
 * `bench/`.
 */
export const WAIT_SCALE = waitScale(process.env.TEST_WAIT_SCALE);

function waitScale(raw: string | undefined): number {
  if (raw === undefined || raw === '') return 3;
  const n = Number(raw);
  if (!Number.isFinite(n) || n < 1 || n > 20) throw new Error(`TEST_WAIT_SCALE must be a number from 1 to 20, got "${raw}"`);
  return n;
}

/** Polls `probe` until it returns a truthy value or `timeoutMs` × `WAIT_SCALE` passes (then throws with `what`). */
export async function waitFor<T>(what: string, probe: () => Promise<T | null | undefined | false>, timeoutMs = 10_000, everyMs = 50): Promise<T> {
  const limitMs = timeoutMs * WAIT_SCALE;
  const deadline = Date.now() + limitMs;
  let last: T | null | undefined | false;
  while (Date.now() < deadline) {
    last = await probe();
    if (last) return last;
    await new Promise((r) => setTimeout(r, everyMs));
  }
  throw new Error(`timed out after ${limitMs} ms waiting for ${what} (last: ${JSON.stringify(last)?.slice(0, 300)})`);
}
