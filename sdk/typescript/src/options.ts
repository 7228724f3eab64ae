// Options objects are checked: a misspelt or unknown option is a TypeError naming it, never
// silently ignored (a `timeoutMs` that did nothing once gave a sandbox an hour instead of a
// minute). Spellings other SDKs use for the same thing are accepted and translated.

import { CONNECTION_KEYS } from './http.js';

/** Keys every call takes beside its own. */
const COMMON = ['signal', ...CONNECTION_KEYS];

/**
 * Returns a copy of `opts` with aliases translated, after checking every key is `known` (or a
 * connection option). `where` names the call in the error.
 * Aliases: `envs` for `env`; `timeoutMs` (milliseconds) for `timeoutSec` (or, where the call
 * takes `timeout` in seconds, for `timeout`).
 */
export function checkOptions<T extends object>(opts: T | null | undefined, known: readonly string[], where: string): T & Record<string, any> {
  if (opts == null) return {} as T;
  if (typeof opts !== 'object' || Array.isArray(opts)) {
    throw new TypeError(`${where}: options must be an object`);
  }
  const o: Record<string, any> = { ...opts };
  const alias = (from: string, to: string, convert: (v: any) => unknown = (v) => v) => {
    if (o[from] === undefined) return;
    if (!known.includes(to)) return;
    if (o[to] !== undefined) throw new TypeError(`${where}: give ${from} or ${to}, not both`);
    o[to] = convert(o[from]);
    delete o[from];
  };
  alias('envs', 'env');
  const seconds = (ms: unknown): number => {
    if (typeof ms !== 'number' || !Number.isFinite(ms) || ms < 0) {
      throw new TypeError(`${where}: timeoutMs must be a number of milliseconds`);
    }
    return ms;
  };
  alias('timeoutMs', 'timeoutSec', (ms: unknown) => Math.max(1, Math.ceil(seconds(ms) / 1000)));
  alias('timeoutMs', 'timeout', (ms: unknown) => seconds(ms) / 1000);
  const unknown = Object.keys(o).filter((k) => o[k] !== undefined && !known.includes(k) && !COMMON.includes(k));
  if (unknown.length > 0) {
    const names = unknown.map((k) => JSON.stringify(k)).join(', ');
    throw new TypeError(`${where}: unknown option ${names}; it takes ${[...known].sort().join(', ')}`);
  }
  return o as T & Record<string, any>;
}
