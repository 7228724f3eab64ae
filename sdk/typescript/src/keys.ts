// API keys of a workspace: list, create (the secret is in that answer only), revoke.

import { request } from './http.js';
import { camelize, compact } from './convert.js';
import { checkOptions } from './options.js';
import { configOf, listAll } from './resources.js';
import { workspaceId } from './workspace.js';
import type { ApiKeyCreateOptions, ApiKeyInfo, ConnectionOptions, ListOptions } from './types.js';

function keyInfo(raw: unknown): ApiKeyInfo {
  const k = camelize<ApiKeyInfo>(raw);
  k.key ??= null;
  return k;
}

/** API keys. Scope `admin`: a workspace's admin key manages its own workspace's keys. */
export class ApiKey {
  /** The keys that are not revoked (never their secrets). */
  static async list(opts: ListOptions = {}): Promise<ApiKeyInfo[]> {
    const data = await listAll(configOf(opts), '/api-keys', { limit: opts.limit }, opts.signal);
    return data.map(keyInfo);
  }

  /**
   * Makes a key with some scopes (no more than the caller holds); its secret is in `key`, in
   * this answer only.
   */
  static async create(opts: ApiKeyCreateOptions): Promise<ApiKeyInfo> {
    const o = checkOptions(opts, ['name', 'scopes', 'workspaceId', 'expiresAt'], 'ApiKey.create');
    const config = configOf(o);
    const ws = await workspaceId(config, o);
    const expires = o.expiresAt instanceof Date ? o.expiresAt.toISOString() : o.expiresAt;
    const r = await request(config, 'POST', '/api-keys', {
      json: compact({ workspace_id: ws, name: o.name, scopes: o.scopes, expires_at: expires }),
      signal: o.signal,
    });
    return keyInfo(r.data);
  }

  /** Revokes a key: it gets AuthenticationError from its next request on. Returns it. */
  static async revoke(keyId: string, opts: ConnectionOptions & { signal?: AbortSignal } = {}): Promise<ApiKeyInfo> {
    const r = await request(configOf(opts), 'DELETE', `/api-keys/${encodeURIComponent(keyId)}`, { signal: opts.signal });
    return keyInfo(r.data);
  }
}
