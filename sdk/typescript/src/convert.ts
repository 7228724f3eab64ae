// The API's snake_case objects as camelCase JavaScript objects.

import type { SandboxInfo } from './types.js';

const camel = (k: string): string => k.replace(/_([a-z0-9])/g, (_: string, c: string) => c.toUpperCase());

/** Keys whose values are user maps, kept as they are. */
const OPAQUE = new Set(['metadata', 'env', 'details']);

/** Fields (camelCase) that hold RFC 3339 times and become Dates. */
const DATES = new Set([
  'createdAt',
  'startedAt',
  'readyAt',
  'destroyedAt',
  'endedAt',
  'modifiedAt',
  'measuredAt',
  'expiresAt',
  'lastUsedAt',
  'finishedAt',
  'queuedAt',
]);

/** Converts an API object's keys to camelCase, deeply, and its times to Dates. */
export function camelize<T = any>(value: unknown): T {
  if (Array.isArray(value)) return value.map(camelize) as T;
  if (!value || typeof value !== 'object') return value as T;
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(value)) {
    const key = camel(k);
    if (OPAQUE.has(k)) out[key] = v && typeof v === 'object' ? { ...v } : v;
    else if (DATES.has(key) && typeof v === 'string') out[key] = new Date(v);
    else out[key] = camelize(v);
  }
  return out as T;
}

/** A sandbox object as SandboxInfo (`sandboxId` is an alias of `id`). */
export function sandboxInfo(raw: unknown): SandboxInfo {
  const info = camelize<SandboxInfo>(raw);
  info.sandboxId = info.id;
  return info;
}

/** Drops undefined values (so that the server's defaults apply). */
export function compact(obj: Record<string, unknown>): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(obj)) if (v !== undefined) out[k] = v;
  return out;
}

/** Converts a camelCase options object's keys to the API's snake_case (one level). */
export function snakeize(obj: Record<string, unknown>): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(obj)) {
    if (v !== undefined) out[k.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`)] = v;
  }
  return out;
}

/** An RFC 3339 string as a Date (other values as they are). */
export function toDate(v: unknown): unknown {
  return typeof v === 'string' ? new Date(v) : v;
}
