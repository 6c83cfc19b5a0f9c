// `npm start`: every role (or those in HERALD_ROLES) in one process.
import { run } from './run.js';

await run();
