// Procfile process type `scheduler`: this role alone.
import { run } from './run.js';

await run(['scheduler']);
