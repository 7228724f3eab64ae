// Files inside a sandbox: `sandbox.files`.

import { NotFoundError } from './errors.js';
import { camelize } from './convert.js';
import { parseSSE } from './sse.js';

function entryInfo(raw) {
  return camelize(raw);
}

function octalMode(mode) {
  if (mode === undefined || mode === null) return undefined;
  if (typeof mode === 'number') return mode.toString(8).padStart(4, '0');
  return String(mode);
}

function rangeHeader(range) {
  if (range == null) return undefined;
  if (typeof range === 'string') return range.startsWith('bytes=') ? range : `bytes=${range}`;
  const { start, end } = range;
  if (start == null && end != null) throw new TypeError('a range needs a start (or use a suffix string like "-100")');
  return `bytes=${start}-${end ?? ''}`;
}

/** Makes an upload body fetch accepts from what a caller may hand over. */
function uploadBody(data) {
  if (typeof data === 'string' || data instanceof ArrayBuffer || ArrayBuffer.isView(data)) return data;
  if (typeof Blob !== 'undefined' && data instanceof Blob) return data;
  if (typeof ReadableStream !== 'undefined' && data instanceof ReadableStream) return data;
  if (data && typeof data[Symbol.asyncIterator] === 'function') {
    // A Node stream or any async iterable of chunks.
    const it = data[Symbol.asyncIterator]();
    const enc = new TextEncoder();
    return new ReadableStream({
      async pull(ctrl) {
        const { value, done } = await it.next();
        if (done) ctrl.close();
        else if (typeof value === 'string') ctrl.enqueue(enc.encode(value));
        else if (ArrayBuffer.isView(value)) ctrl.enqueue(new Uint8Array(value.buffer, value.byteOffset, value.byteLength));
        else ctrl.enqueue(new Uint8Array(value));
      },
      async cancel() {
        await it.return?.();
      },
    });
  }
  throw new TypeError('file data is a string, bytes, a Blob, a ReadableStream or an async iterable');
}

/** A followed directory: async-iterate it for events; stop() ends it. */
export class WatchHandle {
  constructor(res, ctrl, path) {
    this._res = res;
    this._ctrl = ctrl;
    this.path = path;
    this._iter = null;
    this._stopped = false;
    this._done = null;
  }

  async *_events() {
    try {
      for await (const msg of parseSSE(this._res.body)) {
        let d;
        try {
          d = JSON.parse(msg.data);
        } catch {
          continue;
        }
        const ev = { type: msg.event, path: d.path, dir: Boolean(d.dir) };
        if (d.from !== undefined) ev.from = d.from;
        yield ev;
      }
    } catch (e) {
      if (!this._stopped) throw e;
    }
  }

  [Symbol.asyncIterator]() {
    if (this._iter) throw new Error('a watch can be iterated once');
    this._iter = this._events();
    return this._iter;
  }

  _listen(onEvent, onError) {
    this._done = (async () => {
      try {
        for await (const ev of this) await onEvent(ev);
      } catch (e) {
        if (onError) onError(e);
      }
    })();
  }

  /** Ends the watch. */
  async stop() {
    if (this._stopped) return;
    this._stopped = true;
    this._ctrl.abort();
    if (this._iter) await this._iter.return(undefined).catch(() => {});
    else await this._res.body?.cancel().catch(() => {});
    await this._done;
  }

  async [Symbol.asyncDispose ?? Symbol.for('Symbol.asyncDispose')]() {
    await this.stop();
  }
}

/** The sandbox's filesystem. Paths are absolute paths inside the sandbox. */
export class Files {
  /** @param {import('./sandbox.js').Sandbox} sandbox */
  constructor(sandbox) {
    this._sandbox = sandbox;
  }

  /**
   * Reads a file. `format`: `text` (default), `bytes` (Uint8Array), `blob` or `stream`
   * (a ReadableStream). `range`: `{start, end}` (bytes, end inclusive) or an HTTP range
   * string like `"-100"` (the last 100 bytes).
   */
  async read(path, opts = {}) {
    const format = opts.format ?? 'text';
    if (!['text', 'bytes', 'blob', 'stream'].includes(format)) {
      throw new TypeError(`unknown format ${JSON.stringify(format)}: use text, bytes, blob or stream`);
    }
    const range = rangeHeader(opts.range);
    const res = await this._sandbox._request('GET', '/files', {
      query: { path },
      headers: range ? { range } : undefined,
      signal: opts.signal,
      as: 'response',
    });
    if (format === 'stream') return res.body;
    if (format === 'blob') return res.blob();
    if (format === 'bytes') return new Uint8Array(await res.arrayBuffer());
    return res.text();
  }

  /**
   * Writes a file (parents are made), replacing what was there; returns its entry.
   * `write([{path, data}, ...])` writes several and returns their entries.
   */
  async write(pathOrFiles, data, opts = {}) {
    if (Array.isArray(pathOrFiles)) {
      const options = data ?? {};
      const out = [];
      for (const f of pathOrFiles) out.push(await this.write(f.path, f.data, { ...options, ...f, path: undefined, data: undefined }));
      return out;
    }
    const body = uploadBody(data);
    const r = await this._sandbox._request('PUT', '/files', {
      query: { path: pathOrFiles, user: opts.user, mode: octalMode(opts.mode) },
      body,
      headers: { 'content-type': 'application/octet-stream' },
      signal: opts.signal,
      timeoutMs: opts.requestTimeoutMs ?? null,
    });
    return entryInfo(r.data);
  }

  /**
   * Lists a directory (sorted by path; `recursive` for the whole tree). The array has a
   * `truncated` property: true when there were more than `limit` (default 1000) entries.
   */
  async list(path, opts = {}) {
    const r = await this._sandbox._request('GET', '/files/list', {
      query: { path, recursive: opts.recursive ? 'true' : undefined, limit: opts.limit },
    });
    const entries = r.data.map(entryInfo);
    Object.defineProperty(entries, 'truncated', { value: Boolean(r.truncated), enumerable: false });
    return entries;
  }

  /** Removes a file, a symlink or an empty directory (`recursive` for a full one). */
  async remove(path, opts = {}) {
    await this._sandbox._request('DELETE', '/files', {
      query: { path, recursive: opts.recursive ? 'true' : undefined },
    });
  }

  /** Makes a directory and its missing parents (like `mkdir -p`); returns its entry. */
  async makeDir(path) {
    const r = await this._sandbox._request('POST', '/files/mkdir', { json: { path } });
    return entryInfo(r.data);
  }

  /** Renames (moves) a path within the sandbox; returns the entry at `to`. */
  async rename(from, to) {
    const r = await this._sandbox._request('POST', '/files/move', { json: { from, to } });
    return entryInfo(r.data);
  }

  /** Whether a path exists (a symlink counts, whether or not its target does). */
  async exists(path) {
    try {
      await this.stat(path);
      return true;
    } catch (e) {
      if (e instanceof NotFoundError) return false;
      throw e;
    }
  }

  /** The entry of one path (a symlink is described, not followed). */
  async stat(path) {
    const r = await this._sandbox._request('GET', '/files/stat', { query: { path } });
    return entryInfo(r.data);
  }

  /** Alias of stat(). */
  async getInfo(path) {
    return this.stat(path);
  }

  /**
   * Follows changes in a directory (`recursive` for the tree below). Resolves once the watch
   * is in place; async-iterate the handle for events `{type, path, dir, from?}`, or pass
   * `onEvent`. Call stop() to end it.
   */
  async watch(path, opts = {}) {
    const ctrl = new AbortController();
    const onAbort = () => ctrl.abort(opts.signal.reason);
    opts.signal?.addEventListener('abort', onAbort, { once: true });
    const res = await this._sandbox._request('GET', '/files/watch', {
      query: { path, recursive: opts.recursive ? 'true' : undefined },
      signal: ctrl.signal,
      as: 'response',
    });
    const handle = new WatchHandle(res, ctrl, path);
    if (opts.onEvent) handle._listen(opts.onEvent, opts.onError);
    return handle;
  }
}
