import { join, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import swaggerJsdoc from 'swagger-jsdoc';
import { allSchemas } from '../lib/schemas/index.js';

const here = dirname(fileURLToPath(import.meta.url));

/**
 * Builds the OpenAPI 3.0 document from the `@openapi` blocks beside each handler (in source or
 * in the built output) and the schemas of `lib/schemas`, the same objects ajv validates with.
 */
export function buildOpenApi(): Record<string, unknown> {
  const doc = swaggerJsdoc({
    failOnErrors: true,
    apis: [join(here, 'routes', '*.ts').replace(/\\/g, '/'), join(here, 'routes', '*.js').replace(/\\/g, '/')].filter((p) => !p.endsWith('.d.ts')),
    definition: {
      openapi: '3.0.3',
      info: {
        title: 'Herald',
        version: '1.0.0',
        description: 'Self-hosted notification orchestration for mobile apps. Every response uses the envelope of `ErrorEnvelope` / `<Name>Response`.',
      },
      servers: [{ url: '/' }],
      security: [{ bearer: [] }],
      components: {
        securitySchemes: { bearer: { type: 'http', scheme: 'bearer', description: 'An API key: svc_ws_…, svc_tn_… or svc_pk_….' } },
        responses: {
          Error: { description: 'An error in the envelope; branch on error.code.', content: { 'application/json': { schema: { $ref: '#/components/schemas/ErrorEnvelope' } } } },
        },
        parameters: {
          limit: { name: 'limit', in: 'query', required: false, schema: { type: 'integer', minimum: 1, maximum: 100, default: 50 } },
          cursor: { name: 'cursor', in: 'query', required: false, description: "The previous page's nextCursor.", schema: { type: 'string' } },
          workspaceSlug: { name: 'workspaceSlug', in: 'path', required: true, schema: { type: 'string' } },
          serviceTenant: { name: 'Service-Tenant', in: 'header', required: false, description: 'Tenant slug for workspace keys; `default` when absent.', schema: { type: 'string' } },
        },
        schemas: allSchemas(),
      },
    },
  }) as Record<string, unknown>;
  return doc;
}
