#!/usr/bin/env node
// `npm start`: builds dist/ if needed, then runs the service (dist/bin/start.js: every role, or those
// in HERALD_ROLES) in this same process. The start script `exec`s it, so npm's child is this
// process and the SIGTERM or SIGINT npm forwards when it is stopped reaches the service (through a
// shell in between it would not: the service would outlive `npm start` and keep its port).
import { ensureBuilt } from './ensure-build.js';

ensureBuilt();
await import('../dist/bin/start.js');
