import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

/** The project root (the folder holding package.json), found from this file in source or in `dist/`. */
export const PROJECT_ROOT: string = (() => {
  let dir = dirname(fileURLToPath(import.meta.url));
  for (let i = 0; i < 5; i++) {
    if (existsSync(join(dir, 'package.json')) && existsSync(join(dir, 'lua'))) return dir;
    dir = dirname(dir);
  }
  throw new Error('cannot find the project root above ' + fileURLToPath(import.meta.url));
})();
