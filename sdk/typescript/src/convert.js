// The API's snake_case objects as camelCase JavaScript objects.

const camel = (k) => k.replace(/_([a-z0-9])/g, (_, c) => c.toUpperCase());

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
]);

/** Converts an API object's keys to camelCase, deeply, and its times to Dates. */
export function camelize(value) {
  if (Array.isArray(value)) return value.map(camelize);
  if (!value || typeof value !== 'object') return value;
  const out = {};
  for (const [k, v] of Object.entries(value)) {
    const key = camel(k);
    if (OPAQUE.has(k)) out[key] = v && typeof v === 'object' ? { ...v } : v;
    else if (DATES.has(key) && typeof v === 'string') out[key] = new Date(v);
    else out[key] = camelize(v);
  }
  return out;
}

/** A sandbox object as SandboxInfo (`sandboxId` is an alias of `id`). */
export function sandboxInfo(raw) {
  const info = camelize(raw);
  info.sandboxId = info.id;
  return info;
}

/** Drops undefined values (so that the server's defaults apply). */
export function compact(obj) {
  const out = {};
  for (const [k, v] of Object.entries(obj)) if (v !== undefined) out[k] = v;
  return out;
}
