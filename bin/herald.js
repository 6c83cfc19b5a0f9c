#!/usr/bin/env node
// The operator CLI (`npx herald …`): builds if needed, then runs dist/bin/cli.js.
import { ensureBuilt } from './ensure-build.js';

ensureBuilt();
const { main } = await import('../dist/bin/cli.js');
process.exitCode = await main(process.argv.slice(2));
