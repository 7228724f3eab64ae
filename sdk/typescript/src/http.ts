// The transport: configuration, requests, the error envelope, 429 retries.

import { CellaError, ConnectionError, TimeoutError, errorFor, errorFromEnvelope } from './errors.js';
import type { ConnectionOptions } from './types.js';

export const DEFAULT_SERVER: string = 'http://127.0.0.1:7070';
const API_BASE = '/api/v1';

function env(name: string): string | undefined {
  const proc = (globalThis as { process?: { env?: Record<string, string | undefined> } }).process;
  const v = proc?.env?.[name];
  return v === undefined || v === '' ? undefined : v;
}

/** Resolved connection settings shared by a sandbox and everything made from it. */
export class ConnectionConfig {
  readonly server: string;
  readonly apiKey: string | null;
  readonly maxRetries: number;
  readonly requestTimeoutMs: number;
  readonly headers: Record<string, string>;
  readonly fetch: typeof fetch | null;

  constructor(opts: ConnectionOptions | ConnectionConfig = {}) {
    if (opts instanceof ConnectionConfig) opts = opts.toOptions();
    let server = String(opts.server ?? env('CELLA_SERVER') ?? DEFAULT_SERVER).trim();
    if (!/^[a-z][a-z0-9+.-]*:\/\//i.test(server)) server = `http://${server}`;
    server = server.replace(/\/+$/, '');
    if (server.endsWith(API_BASE)) server = server.slice(0, -API_BASE.length);
    this.server = server;
    this.apiKey = opts.apiKey ?? env('CELLA_API_KEY') ?? null;
    this.maxRetries = opts.maxRetries ?? 3;
    this.requestTimeoutMs = opts.requestTimeoutMs ?? 60_000;
    this.headers = { ...(opts.headers ?? {}) };
    this.fetch = opts.fetch ?? null;
  }

  /** The options that make this configuration again. */
  toOptions(): ConnectionOptions {
    return {
      server: this.server,
      apiKey: this.apiKey ?? undefined,
      maxRetries: this.maxRetries,
      requestTimeoutMs: this.requestTimeoutMs,
      headers: { ...this.headers },
      fetch: this.fetch ?? undefined,
    };
  }

  /** A copy with some options changed (the ones given that are not undefined). */
  with(opts: ConnectionOptions = {}): ConnectionConfig {
    const merged: Record<string, unknown> = { ...this.toOptions() };
    for (const [k, v] of Object.entries(opts)) if (v !== undefined) merged[k] = v;
    return new ConnectionConfig(merged);
  }
}

/** The connection options a caller may mix into any options object. */
export const CONNECTION_KEYS: readonly string[] = ['server', 'apiKey', 'maxRetries', 'requestTimeoutMs', 'headers', 'fetch'];

/** Splits connection options off an options object. */
export function connectionOptions(opts: object = {}): ConnectionOptions {
  const src = opts as Record<string, unknown>;
  const out: Record<string, unknown> = {};
  for (const k of CONNECTION_KEYS) if (src[k] !== undefined) out[k] = src[k];
  return out as ConnectionOptions;
}

/** Seconds to wait from a `Retry-After` header (seconds or an HTTP date); null if absent. */
export function parseRetryAfter(value: string | null | undefined): number | null {
  if (value == null || value === '') return null;
  const n = Number(value);
  if (Number.isFinite(n)) return Math.max(0, n);
  const t = Date.parse(value);
  if (Number.isFinite(t)) return Math.max(0, (t - Date.now()) / 1000);
  return null;
}

export function sleep(ms: number, signal?: AbortSignal | null): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const timer = setTimeout(() => {
      signal?.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}

export type Query = Record<string, string | number | boolean | null | undefined | Array<string | number>>;

function buildQuery(query: Query | undefined): string {
  const params = new URLSearchParams();
  if (!query) return '';
  for (const [k, v] of Object.entries(query)) {
    if (v === undefined || v === null) continue;
    if (Array.isArray(v)) for (const item of v) params.append(k, String(item));
    else params.append(k, String(v));
  }
  const s = params.toString();
  return s ? `?${s}` : '';
}

function isReplayable(body: unknown): boolean {
  return (
    body == null ||
    typeof body === 'string' ||
    body instanceof ArrayBuffer ||
    ArrayBuffer.isView(body) ||
    (typeof Blob !== 'undefined' && body instanceof Blob) ||
    body instanceof URLSearchParams
  );
}

/** Turns a non-2xx response into its typed error (reads and closes the body). */
export async function errorFromResponse(res: Response): Promise<CellaError> {
  const requestId = res.headers.get('x-request-id');
  const retryAfter = parseRetryAfter(res.headers.get('retry-after'));
  let text = '';
  try {
    text = await res.text();
  } catch {
    // the body broke off: the status still says what happened
  }
  let parsed: any = null;
  try {
    parsed = JSON.parse(text);
  } catch {
    parsed = null;
  }
  if (parsed && typeof parsed === 'object' && parsed.error && typeof parsed.error === 'object') {
    return errorFromEnvelope(parsed, { status: res.status, requestId, retryAfter });
  }
  return errorFor({
    code: null,
    message: text.trim() || res.statusText || `HTTP ${res.status}`,
    status: res.status,
    requestId,
    retryAfter,
  });
}

/** The options of one request. */
export interface RequestOptions {
  query?: Query;
  /** A JSON body. */
  json?: unknown;
  /** A raw body (string, bytes, Blob, ReadableStream). */
  body?: BodyInit | null;
  headers?: Record<string, string>;
  signal?: AbortSignal | null;
  /** 0 or null: no client timeout. */
  timeoutMs?: number | null;
  /** `response`: the Response, its body unread (the timeout then covers only the headers). */
  as?: 'json' | 'response';
}

/** The JSON answer of a route: `{data, next_cursor?, ...}`. */
export interface ApiBody {
  data: any;
  next_cursor?: string | null;
  [field: string]: any;
}

/** Makes one API request, retrying a 429 after its `Retry-After` up to `maxRetries` times. */
export async function request(config: ConnectionConfig, method: string, path: string, opts: RequestOptions & { as: 'response' }): Promise<Response>;
export async function request(config: ConnectionConfig, method: string, path: string, opts?: RequestOptions): Promise<ApiBody>;
export async function request(config: ConnectionConfig, method: string, path: string, opts: RequestOptions = {}): Promise<ApiBody | Response> {
  const url = `${config.server}${API_BASE}${path}${buildQuery(opts.query)}`;
  const headers: Record<string, string> = { ...config.headers, ...(opts.headers ?? {}) };
  if (config.apiKey) headers.authorization = `Bearer ${config.apiKey}`;
  let body = opts.body;
  if (opts.json !== undefined) {
    body = JSON.stringify(opts.json);
    headers['content-type'] = 'application/json';
  }
  const streamingBody = body != null && !isReplayable(body);
  const timeoutMs = opts.timeoutMs === undefined ? config.requestTimeoutMs : opts.timeoutMs;
  const fetchImpl = config.fetch ?? globalThis.fetch;
  const as = opts.as ?? 'json';

  for (let attempt = 0; ; attempt++) {
    const ctrl = new AbortController();
    let timedOut = false;
    const onAbort = () => ctrl.abort(opts.signal?.reason);
    if (opts.signal) {
      if (opts.signal.aborted) throw opts.signal.reason;
      opts.signal.addEventListener('abort', onAbort, { once: true });
    }
    const timer =
      timeoutMs && timeoutMs > 0
        ? setTimeout(() => {
            timedOut = true;
            ctrl.abort();
          }, timeoutMs)
        : null;
    const cleanup = () => {
      if (timer) clearTimeout(timer);
      opts.signal?.removeEventListener('abort', onAbort);
    };
    const fail = (e: any): unknown => {
      if (opts.signal?.aborted) return opts.signal.reason;
      if (timedOut) {
        return new TimeoutError(`${method} ${path}: no answer within ${timeoutMs} ms`, { code: 'TIMEOUT', cause: e });
      }
      return new ConnectionError(`${method} ${url}: ${e?.cause?.message ?? e?.message ?? e}`, {
        code: 'CONNECTION',
        cause: e,
      });
    };

    let res: Response;
    try {
      const init: RequestInit & { duplex?: 'half' } = { method, headers, body, signal: ctrl.signal };
      if (streamingBody) init.duplex = 'half';
      res = await fetchImpl(url, init);
    } catch (e) {
      cleanup();
      throw fail(e);
    }

    if (res.status === 429 && attempt < config.maxRetries && !streamingBody) {
      const wait = parseRetryAfter(res.headers.get('retry-after')) ?? 1;
      try {
        await res.body?.cancel();
      } catch {
        // nothing to release
      }
      cleanup();
      await sleep(wait * 1000, opts.signal);
      continue;
    }

    if (!res.ok) {
      try {
        throw await errorFromResponse(res);
      } finally {
        cleanup();
      }
    }

    if (as === 'response') {
      // The caller reads the body (a stream, bytes): the timeout stops at the headers, but the
      // caller's signal still aborts the body.
      if (timer) clearTimeout(timer);
      return res;
    }
    try {
      const text = await res.text();
      return (text ? JSON.parse(text) : null) as ApiBody;
    } catch (e) {
      throw fail(e);
    } finally {
      cleanup();
    }
  }
}
