// Procfile process type `dispatcher`: this role alone.
import { run } from './run.js';

await run(['dispatcher']);
