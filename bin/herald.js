#!/usr/bin/env node
// The operator CLI (`npx herald …`): builds if needed, then runs dist/bin/cli.js.
import { ensureBuilt } from './ensure-build.js';

ensureBuilt();
const { main } = await import('../dist/bin/cli.js');
// exit once the command is done: a connection to a Redis that stopped answering (paused, a network
// partition) may never finish closing, and must not keep the process waiting (stdout and stderr are
// written synchronously to files and pipes, so nothing printed is lost)
process.exit(await main(process.argv.slice(2)));
