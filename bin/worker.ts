// Procfile process type `worker`: this role alone.
import { run } from './run.js';

await run(['worker']);
