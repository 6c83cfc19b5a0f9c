import { Ajv, type ValidateFunction } from 'ajv';
import addFormatsModule from 'ajv-formats';

const addFormats = ((addFormatsModule as unknown as { default?: unknown }).default ?? addFormatsModule) as (ajv: Ajv) => Ajv;

export type Reply<T = any> = { status: number; headers: Headers; body: T; text: string };
type Operation = { pattern: RegExp; method: string; path: string; responses: Record<string, { $ref?: string; content?: Record<string, { schema?: unknown }> }> };
type Contract = { ajv: Ajv; operations: Operation[]; validators: Map<string, ValidateFunction> };

const contracts = new Map<string, Promise<Contract>>();

async function loadContract(baseUrl: string): Promise<Contract> {
  const doc = (await (await fetch(`${baseUrl}/v1/openapi.json`)).json()) as any;
  const ajv = new Ajv({ allErrors: true, strict: false });
  addFormats(ajv);
  // JSON Schema's `idn-email` (RFC 6531), which ajv-formats leaves out: an address of any script
  ajv.addFormat('idn-email', /^[^\s@]+@[^\s@]+\.[^\s@]+$/u);
  ajv.addSchema({ $id: 'openapi', components: doc.components });
  const operations: Operation[] = [];
  for (const [path, item] of Object.entries<any>(doc.paths)) {
    // with or without a trailing slash, as the router serves each path (docs/architecture.md)
    const pattern = new RegExp('^' + path.replace(/[.*+?^${}()|[\]\\]/g, (c) => (c === '{' || c === '}' ? c : '\\' + c)).replace(/\{[^}]+\}/g, '[^/]+') + '/?$');
    for (const [method, op] of Object.entries<any>(item)) operations.push({ pattern, method: method.toUpperCase(), path, responses: op.responses ?? {} });
  }
  return { ajv, operations, validators: new Map() };
}

function schemaFor(contract: Contract, op: Operation | undefined, status: number): { key: string; schema: unknown } {
  if (!op) return { key: 'ErrorEnvelope', schema: { $ref: 'openapi#/components/schemas/ErrorEnvelope' } };
  let response = op.responses[String(status)] ?? op.responses.default;
  if (!response) throw new Error(`${op.method} ${op.path} documents no response for ${status}`);
  if (response.$ref) response = { $ref: undefined, content: { 'application/json': { schema: { $ref: response.$ref.replace('#/components/responses/', '') } } } } as any;
  let schema = response.content?.['application/json']?.schema as any;
  if (schema?.$ref && !schema.$ref.startsWith('#/')) schema = { $ref: 'openapi#/components/schemas/ErrorEnvelope' }; // components.responses.Error
  const rewrite = (s: any): any => (s && typeof s === 'object' ? (Array.isArray(s) ? s.map(rewrite) : Object.fromEntries(Object.entries(s).map(([k, v]) => [k, k === '$ref' && typeof v === 'string' && v.startsWith('#/') ? 'openapi' + v : rewrite(v)]))) : s);
  return { key: `${op.method} ${op.path} ${status}`, schema: rewrite(schema) };
}

/**
 * An HTTP client for tests: real requests over loopback, and every answer checked against the
 * schema the service's own OpenAPI document declares for that operation and status, plus the
 * envelope's Request-Id rule. A drift between behaviour and document fails the test.
 */
export function client(baseUrl: string) {
  const call = async <T = any>(method: string, path: string, options: { key?: string; body?: unknown; headers?: Record<string, string>; raw?: string | Uint8Array } = {}): Promise<Reply<T>> => {
    const headers: Record<string, string> = { ...options.headers };
    if (options.key) headers.authorization = `Bearer ${options.key}`;
    let body: string | Uint8Array | undefined;
    if (options.raw !== undefined) body = options.raw;
    else if (options.body !== undefined) body = JSON.stringify(options.body);
    if (body !== undefined && !headers['content-type']) headers['content-type'] = 'application/json';
    const res = await fetch(baseUrl + path, { method, headers, body });
    const text = await res.text();
    let parsed: any = null;
    try {
      parsed = JSON.parse(text);
    } catch {
      throw new Error(`${method} ${path} answered ${res.status} with a body that is not JSON: ${text.slice(0, 200)}`);
    }
    if (!path.startsWith('/v1/openapi.json')) {
      let contract = contracts.get(baseUrl);
      if (!contract) contracts.set(baseUrl, (contract = loadContract(baseUrl)));
      const c = await contract;
      const bare = path.split('?')[0]!;
      const op = c.operations.find((o) => o.method === method && o.pattern.test(bare));
      const { key, schema } = schemaFor(c, op, res.status);
      let validate = c.validators.get(key);
      if (!validate) c.validators.set(key, (validate = c.ajv.compile(schema as object)));
      if (!(validate as (d: unknown) => boolean)(parsed)) {
        throw new Error(`${method} ${path} → ${res.status} does not match the published schema (${key}): ${c.ajv.errorsText(validate.errors)}\n${text.slice(0, 500)}`);
      }
      if (res.headers.get('request-id') !== parsed.metadata?.requestId) throw new Error(`${method} ${path}: Request-Id header differs from metadata.requestId`);
    }
    return { status: res.status, headers: res.headers, body: parsed, text };
  };
  return {
    call,
    get: <T = any>(path: string, key?: string, headers?: Record<string, string>) => call<T>('GET', path, { key, headers }),
    post: <T = any>(path: string, key: string | undefined, body?: unknown, headers?: Record<string, string>) => call<T>('POST', path, { key, body, headers }),
    patch: <T = any>(path: string, key: string | undefined, body?: unknown, headers?: Record<string, string>) => call<T>('PATCH', path, { key, body, headers }),
    del: <T = any>(path: string, key?: string, headers?: Record<string, string>) => call<T>('DELETE', path, { key, headers }),
  };
}

/**
 * A client registration as an app sends it: one answered 429 `lock_timeout` (retryable, spec Part 7)
 * is sent again after its Retry-After, for up to a minute. Many registrations of one token at once
 * wait in turn for its lock, at most 5 s each; on a loaded machine the last ones ran out of it (three
 * shards on two cores: "50 parallel registrations" got 429s; 150 ms more per registration does it every time).
 */
export async function registerAsApp(api: ReturnType<typeof client>, pk: string, body: Record<string, unknown>): Promise<Reply> {
  const giveUpAt = Date.now() + 60_000;
  for (;;) {
    const res = await api.post('/v1/client/subscriptions', pk, body);
    if (res.status !== 429 || res.body.error?.code !== 'lock_timeout' || Date.now() > giveUpAt) return res;
    await new Promise((r) => setTimeout(r, Number(res.headers.get('retry-after') ?? 1) * 1_000));
  }
}
