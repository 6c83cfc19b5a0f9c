// Procfile process type `web`: this role alone.
import { run } from './run.js';

await run(['web']);
