/// <reference lib="esnext.disposable" preserve="true" />
// Files inside a sandbox: `sandbox.files`.

import './dispose.js';
import { NotFoundError } from './errors.js';
import { camelize } from './convert.js';
import { parseSSE } from './sse.js';
import type { Sandbox } from './sandbox.js';
import type { EntryInfo, FileData, FilesystemEvent, ReadOptions, WatchOptions, WriteOptions } from './types.js';

type ReadFormat = 'text' | 'bytes' | 'blob' | 'stream';

function entryInfo(raw: unknown): EntryInfo {
  return camelize<EntryInfo>(raw);
}

function octalMode(mode: number | string | null | undefined): string | undefined {
  if (mode === undefined || mode === null) return undefined;
  if (typeof mode === 'number') return mode.toString(8).padStart(4, '0');
  return String(mode);
}

function rangeHeader(range: ReadOptions['range'] | null): string | undefined {
  if (range == null) return undefined;
  if (typeof range === 'string') return range.startsWith('bytes=') ? range : `bytes=${range}`;
  const { start, end } = range;
  if (start == null && end != null) throw new TypeError('a range needs a start (or use a suffix string like "-100")');
  return `bytes=${start}-${end ?? ''}`;
}

/** Makes an upload body fetch accepts from what a caller may hand over. */
/** @internal */
export function uploadBody(data: FileData): BodyInit {
  if (typeof data === 'string' || data instanceof ArrayBuffer || ArrayBuffer.isView(data)) return data as BodyInit;
  if (typeof Blob !== 'undefined' && data instanceof Blob) return data;
  if (typeof ReadableStream !== 'undefined' && data instanceof ReadableStream) return data;
  if (data && typeof (data as AsyncIterable<unknown>)[Symbol.asyncIterator] === 'function') {
    // A Node stream or any async iterable of chunks.
    const it = (data as AsyncIterable<Uint8Array | string | ArrayBuffer>)[Symbol.asyncIterator]();
    const enc = new TextEncoder();
    return new ReadableStream<Uint8Array>({
      async pull(ctrl) {
        const { value, done } = await it.next();
        if (done) ctrl.close();
        else if (typeof value === 'string') ctrl.enqueue(enc.encode(value));
        else if (ArrayBuffer.isView(value)) ctrl.enqueue(new Uint8Array(value.buffer, value.byteOffset, value.byteLength));
        else ctrl.enqueue(new Uint8Array(value as ArrayBuffer));
      },
      async cancel() {
        await it.return?.();
      },
    });
  }
  throw new TypeError('file data is a string, bytes, a Blob, a ReadableStream or an async iterable');
}

/** A followed directory: async-iterate it for events; stop() ends it. */
export class WatchHandle implements AsyncIterable<FilesystemEvent> {
  /** The directory followed. */
  readonly path: string;
  private readonly _res: Response;
  private readonly _ctrl: AbortController;
  private _iter: AsyncGenerator<FilesystemEvent, void, undefined> | null = null;
  private _stopped = false;
  private _done: Promise<void> | null = null;

  /** @internal */
  constructor(res: Response, ctrl: AbortController, path: string) {
    this._res = res;
    this._ctrl = ctrl;
    this.path = path;
  }

  private async *_events(): AsyncGenerator<FilesystemEvent, void, undefined> {
    try {
      for await (const msg of parseSSE(this._res.body)) {
        let d: any;
        try {
          d = JSON.parse(msg.data);
        } catch {
          continue;
        }
        const ev: FilesystemEvent = { type: msg.event as FilesystemEvent['type'], path: d.path, dir: Boolean(d.dir) };
        if (d.from !== undefined) ev.from = d.from;
        yield ev;
      }
    } catch (e) {
      if (!this._stopped) throw e;
    }
  }

  [Symbol.asyncIterator](): AsyncIterator<FilesystemEvent> {
    if (this._iter) throw new Error('a watch can be iterated once');
    this._iter = this._events();
    return this._iter;
  }

  /** @internal */
  _listen(onEvent: NonNullable<WatchOptions['onEvent']>, onError?: WatchOptions['onError']): void {
    this._done = (async () => {
      try {
        for await (const ev of this) await onEvent(ev);
      } catch (e) {
        if (onError) onError(e);
      }
    })();
  }

  /** Ends the watch. */
  async stop(): Promise<void> {
    if (this._stopped) return;
    this._stopped = true;
    this._ctrl.abort();
    if (this._iter) await this._iter.return(undefined).catch(() => {});
    else await this._res.body?.cancel().catch(() => {});
    await this._done;
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.stop();
  }
}

/** The sandbox's filesystem. Paths are absolute paths inside the sandbox. */
export class Files {
  private readonly _sandbox: Sandbox;

  /** @internal */
  constructor(sandbox: Sandbox) {
    this._sandbox = sandbox;
  }

  /**
   * Reads a file. `format`: `text` (default), `bytes` (Uint8Array), `blob` or `stream`
   * (a ReadableStream). `range`: `{start, end}` (bytes, end inclusive) or an HTTP range
   * string like `"-100"` (the last 100 bytes).
   */
  async read(path: string, opts?: ReadOptions & { format?: 'text' }): Promise<string>;
  async read(path: string, opts: ReadOptions & { format: 'bytes' }): Promise<Uint8Array>;
  async read(path: string, opts: ReadOptions & { format: 'blob' }): Promise<Blob>;
  async read(path: string, opts: ReadOptions & { format: 'stream' }): Promise<ReadableStream<Uint8Array>>;
  async read(path: string, opts: ReadOptions & { format?: ReadFormat } = {}): Promise<string | Uint8Array | Blob | ReadableStream<Uint8Array>> {
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
    if (format === 'stream') return res.body as ReadableStream<Uint8Array>;
    if (format === 'blob') return res.blob();
    if (format === 'bytes') return new Uint8Array(await res.arrayBuffer());
    return res.text();
  }

  /**
   * Writes a file (parents are made), replacing what was there; returns its entry.
   * `write([{path, data}, ...])` writes several and returns their entries.
   */
  async write(path: string, data: FileData, opts?: WriteOptions): Promise<EntryInfo>;
  async write(files: Array<{ path: string; data: FileData } & WriteOptions>, opts?: WriteOptions): Promise<EntryInfo[]>;
  async write(
    pathOrFiles: string | Array<{ path: string; data: FileData } & WriteOptions>,
    data?: FileData | WriteOptions,
    opts: WriteOptions = {},
  ): Promise<EntryInfo | EntryInfo[]> {
    if (Array.isArray(pathOrFiles)) {
      const options = (data ?? {}) as WriteOptions;
      const out: EntryInfo[] = [];
      for (const f of pathOrFiles) {
        const { path, data: content, ...own } = f;
        out.push(await this.write(path, content, { ...options, ...own }));
      }
      return out;
    }
    const body = uploadBody(data as FileData);
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
  async list(path: string, opts: { recursive?: boolean; limit?: number } = {}): Promise<EntryInfo[] & { readonly truncated: boolean }> {
    const r = await this._sandbox._request('GET', '/files/list', {
      query: { path, recursive: opts.recursive ? 'true' : undefined, limit: opts.limit },
    });
    const entries = r.data.map(entryInfo);
    Object.defineProperty(entries, 'truncated', { value: Boolean(r.truncated), enumerable: false });
    return entries as EntryInfo[] & { readonly truncated: boolean };
  }

  /** Removes a file, a symlink or an empty directory (`recursive` for a full one). */
  async remove(path: string, opts: { recursive?: boolean } = {}): Promise<void> {
    await this._sandbox._request('DELETE', '/files', {
      query: { path, recursive: opts.recursive ? 'true' : undefined },
    });
  }

  /** Makes a directory and its missing parents (like `mkdir -p`); returns its entry. */
  async makeDir(path: string): Promise<EntryInfo> {
    const r = await this._sandbox._request('POST', '/files/mkdir', { json: { path } });
    return entryInfo(r.data);
  }

  /** Renames (moves) a path within the sandbox; returns the entry at `to`. */
  async rename(from: string, to: string): Promise<EntryInfo> {
    const r = await this._sandbox._request('POST', '/files/move', { json: { from, to } });
    return entryInfo(r.data);
  }

  /** Whether a path exists (a symlink counts, whether or not its target does). */
  async exists(path: string): Promise<boolean> {
    try {
      await this.stat(path);
      return true;
    } catch (e) {
      if (e instanceof NotFoundError) return false;
      throw e;
    }
  }

  /** The entry of one path (a symlink is described, not followed). */
  async stat(path: string): Promise<EntryInfo> {
    const r = await this._sandbox._request('GET', '/files/stat', { query: { path } });
    return entryInfo(r.data);
  }

  /** Alias of stat(). */
  async getInfo(path: string): Promise<EntryInfo> {
    return this.stat(path);
  }

  /**
   * Follows changes in a directory (`recursive` for the tree below). Resolves once the watch
   * is in place; async-iterate the handle for events `{type, path, dir, from?}`, or pass
   * `onEvent`. Call stop() to end it.
   */
  async watch(path: string, opts: WatchOptions = {}): Promise<WatchHandle> {
    const ctrl = new AbortController();
    const onAbort = () => ctrl.abort(opts.signal?.reason);
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
