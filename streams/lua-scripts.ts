import { createHash } from 'node:crypto';
import { readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { Pipeline, type ChainableCommander, type Redis } from 'ioredis';
import { PROJECT_ROOT } from '../lib/paths.js';

const LUA_DIR = join(PROJECT_ROOT, 'lua');
const INCLUDE = /^--\s*@include\s+"([A-Za-z0-9]+)"\s*$/gm;
import { VERSION } from '../lib/version.js';

type Script = { name: string; numberOfKeys: number; lua: string };

function inline(source: string, seen: Set<string>): string {
  return source.replace(INCLUDE, (_line, fn: string) => {
    if (seen.has(fn)) return '';
    seen.add(fn);
    return inline(readFileSync(join(LUA_DIR, 'includes', `${fn}.lua`), 'utf8'), seen);
  });
}

/** Reads every `lua/<name>-<keys>.lua` once, with its includes inlined once each. */
function readScripts(): Script[] {
  return readdirSync(LUA_DIR)
    .filter((file) => file.endsWith('.lua'))
    .map((file) => {
      const match = /^([a-z][A-Za-z0-9]*)-(\d+)\.lua$/.exec(file);
      if (!match) throw new Error(`lua/${file}: name must be <camelCaseName>-<numberOfKeys>.lua`);
      return { name: match[1]!, numberOfKeys: Number(match[2]), lua: inline(readFileSync(join(LUA_DIR, file), 'utf8'), new Set()) };
    });
}

let scripts: Script[] | null = null;

/** The command name of a script in this package version, so two versions never collide. */
export function commandName(name: string): string {
  return `${name}:${VERSION}`;
}

/**
 * Registers every script on `redis` with `defineCommand` (EVALSHA with EVAL fallback, pipelines too).
 *
 * ioredis copies every defined script onto each new `Pipeline` (two properties per script), and
 * auto-pipelining makes a pipeline per flush: with ~36 scripts that is ~25 µs of CPU and a
 * dictionary-mode object per flush (measured: 25 µs vs 5 µs per `pipeline()`), a large share of a
 * request's cost. So once defined, each script's function is put on `Pipeline.prototype` (the same
 * scripts are defined on every client of the process) and dropped from the client's `scriptsSet`,
 * which only that copy reads; the client keeps its own script methods.
 */
export function defineScripts(redis: Redis): void {
  scripts ??= readScripts();
  const shared = Pipeline.prototype as unknown as Record<string, unknown>;
  const own = redis as unknown as Record<string, unknown> & { scriptsSet: Record<string, ScriptCommands | undefined> };
  for (const script of scripts) {
    const name = commandName(script.name);
    redis.defineCommand(name, { numberOfKeys: script.numberOfKeys, lua: script.lua });
    takeArgumentsAsGiven(own.scriptsSet[name]);
    shared[name] = own[name];
    shared[`${name}Buffer`] = own[`${name}Buffer`];
    delete own.scriptsSet[name];
  }
}

/** What `defineScripts` reaches of an ioredis `Script`: the command class each call is made with. */
type ScriptCommands = { Command?: new (name: string, args: unknown[], options?: object, callback?: unknown) => { args: unknown[]; stringifyArguments(): void } };
const NO_ARGUMENTS: unknown[] = [];

/**
 * ioredis's `Command` copies its arguments with `Array.prototype.flat()`, which costs V8 about
 * 0.25 µs per element (measured on Node 20: 65 µs for 300 arguments, 350 µs for 1,300, against
 * 0.2 µs and 2 µs for a `slice`): a batch of 100 events is ~1,200 script arguments, and the flat
 * copies were 7 % of the web role's busy time under batch ingest. A script call's arguments are
 * flat already (`callScript` takes strings, numbers and Buffers; the script prepends its SHA-1 and
 * key count to a new array), so each script's command class takes them as given and then turns
 * them into strings as the constructor does. This relies on
 * the same ioredis internals as the `Pipeline.prototype` sharing above (`scriptsSet`, `Script`'s
 * `Command`); no key prefix is set on any client (the constructor's prefixing would need the
 * arguments, streams/keys.ts prefixes names itself).
 */
function takeArgumentsAsGiven(script: ScriptCommands | undefined): void {
  const Base = script?.Command;
  if (!script || !Base || typeof Base.prototype.stringifyArguments !== 'function') throw new Error('ioredis internals changed: a defined script has no Command class to extend');
  script.Command = class AsGiven extends Base {
    constructor(name: string, args: unknown[], options?: object, callback?: unknown) {
      super(name, NO_ARGUMENTS, options, callback);
      // what the constructor did to its (empty) copy: numbers to strings, Buffers noted (no argument
      // transformer exists for EVAL/EVALSHA)
      this.args = args;
      this.stringifyArguments();
    }
  };
}

/** Each script's name by its SHA-1 as Redis knows it (EVALSHA's first argument), for profiles of Redis time (bench/). */
export function scriptNamesBySha(): Map<string, string> {
  scripts ??= readScripts();
  return new Map(scripts.map((script) => [createHash('sha1').update(script.lua).digest('hex'), script.name]));
}

type ScriptArg = string | number | Buffer;

/** Calls the script `name` on a client or pipeline; the typed wrappers in `streams/` are its only callers. */
export function callScript<T>(client: Redis, name: string, keys: string[], args: ScriptArg[]): Promise<T>;
export function callScript(client: ChainableCommander, name: string, keys: string[], args: ScriptArg[]): ChainableCommander;
export function callScript(client: Redis | ChainableCommander, name: string, keys: string[], args: ScriptArg[]): unknown {
  const fn = (client as unknown as Record<string, (...a: ScriptArg[]) => unknown>)[commandName(name)];
  if (typeof fn !== 'function') throw new Error(`Lua script ${name} is not defined on this client`);
  return fn.call(client, ...keys, ...args);
}
