// Workspace resources apart from one sandbox: snapshots, artifacts and custom templates.

import { ConnectionConfig, connectionOptions, request, type Query } from './http.js';
import { TemplateBuildError, TimeoutError } from './errors.js';
import { camelize } from './convert.js';
import type {
  ArtifactFormat,
  ArtifactInfo,
  BuildWaitOptions,
  ConnectionOptions,
  DownloadOptions,
  ListOptions,
  SnapshotInfo,
  TemplateBuildInfo,
  TemplateInfo,
  TemplateSpec,
} from './types.js';

type Opts = ConnectionOptions & { signal?: AbortSignal };

const enc = encodeURIComponent;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** @internal */
export function configOf(opts: ConnectionOptions | ConnectionConfig | undefined): ConnectionConfig {
  return opts instanceof ConnectionConfig ? opts : new ConnectionConfig(connectionOptions(opts ?? {}));
}

/** Follows a paginated list to its end. */
/** @internal */
export async function listAll(config: ConnectionConfig, path: string, query: Query, signal?: AbortSignal | null): Promise<any[]> {
  const out: any[] = [];
  let cursor: string | undefined;
  for (;;) {
    const r = await request(config, 'GET', path, { query: { ...query, cursor }, signal });
    out.push(...r.data);
    if (!r.next_cursor || r.data.length === 0) return out;
    cursor = r.next_cursor;
  }
}

/** @internal An artifact object as ArtifactInfo, with `read()` bound to its connection. */
export function artifactInfo(raw: unknown, config: ConnectionConfig): ArtifactInfo {
  const info = camelize<ArtifactInfo>(raw);
  Object.defineProperty(info, 'read', {
    value: (opts: { format?: ArtifactFormat } = {}) =>
      Artifact.download(info.id, { ...config.toOptions(), ...opts } as DownloadOptions & { format: 'bytes' }),
    enumerable: false,
  });
  return info;
}

/** Snapshots of sandboxes' files. Take one with `sandbox.createSnapshot()`. */
export class Snapshot {
  /** The workspace's snapshots, newest first, every page followed. */
  static async list(opts: ListOptions = {}): Promise<SnapshotInfo[]> {
    const config = configOf(opts);
    const data = await listAll(config, '/snapshots', { limit: opts.limit }, opts.signal);
    return data.map((raw) => camelize<SnapshotInfo>(raw));
  }

  /** One snapshot (NotFoundError when unknown). */
  static async get(snapshotId: string, opts: Opts = {}): Promise<SnapshotInfo> {
    const r = await request(configOf(opts), 'GET', `/snapshots/${enc(snapshotId)}`, { signal: opts.signal });
    return camelize(r.data);
  }

  /** Deletes a snapshot (sandboxes made from it keep their files); returns it as it was. */
  static async delete(snapshotId: string, opts: Opts = {}): Promise<SnapshotInfo> {
    const r = await request(configOf(opts), 'DELETE', `/snapshots/${enc(snapshotId)}`, { signal: opts.signal });
    return camelize(r.data);
  }
}

/** Files kept from sandboxes (by `Sandbox.run()` or `sandbox.collectArtifacts()`) until they expire. */
export class Artifact {
  /** The workspace's artifacts, newest first; `sandboxId` keeps one sandbox's. */
  static async list(opts: ListOptions & { sandboxId?: string } = {}): Promise<ArtifactInfo[]> {
    const config = configOf(opts);
    const data = await listAll(config, '/artifacts', { limit: opts.limit, sandbox_id: opts.sandboxId }, opts.signal);
    return data.map((raw) => artifactInfo(raw, config));
  }

  /**
   * An artifact's content (by id, or an ArtifactInfo): `format` `bytes` (default, a
   * Uint8Array), `text`, `blob` or `stream`.
   */
  static async download(artifact: string | ArtifactInfo, opts?: DownloadOptions & { format?: 'bytes' }): Promise<Uint8Array>;
  static async download(artifact: string | ArtifactInfo, opts: DownloadOptions & { format: 'text' }): Promise<string>;
  static async download(artifact: string | ArtifactInfo, opts: DownloadOptions & { format: 'blob' }): Promise<Blob>;
  static async download(artifact: string | ArtifactInfo, opts: DownloadOptions & { format: 'stream' }): Promise<ReadableStream<Uint8Array>>;
  static async download(
    artifact: string | ArtifactInfo,
    opts: DownloadOptions = {},
  ): Promise<Uint8Array | string | Blob | ReadableStream<Uint8Array>> {
    const format = opts.format ?? 'bytes';
    if (!['text', 'bytes', 'blob', 'stream'].includes(format)) {
      throw new TypeError(`unknown format ${JSON.stringify(format)}: use bytes, text, blob or stream`);
    }
    const id = typeof artifact === 'string' ? artifact : artifact?.id;
    const res = await request(configOf(opts), 'GET', `/artifacts/${enc(id)}`, { signal: opts.signal, as: 'response' });
    if (format === 'stream') return res.body as ReadableStream<Uint8Array>;
    if (format === 'blob') return res.blob();
    if (format === 'text') return res.text();
    return new Uint8Array(await res.arrayBuffer());
  }

  /** Deletes an artifact now; returns it as it was. */
  static async delete(artifact: string | ArtifactInfo, opts: Opts = {}): Promise<ArtifactInfo> {
    const config = configOf(opts);
    const id = typeof artifact === 'string' ? artifact : artifact?.id;
    const r = await request(config, 'DELETE', `/artifacts/${enc(id)}`, { signal: opts.signal });
    return artifactInfo(r.data, config);
  }
}

/** Custom templates: build one from a spec, read it, delete it. */
export class Template {
  /**
   * Starts a build of a template (`POST /api/v1/templates`, the spec as the API takes it:
   * `{id, from, steps, files, ...}`); returns its handle at once. See `TemplateBuild.wait()`.
   */
  static async build(spec: TemplateSpec, opts: Opts = {}): Promise<TemplateBuild> {
    const config = configOf(opts);
    const r = await request(config, 'POST', '/templates', { json: spec, signal: opts.signal });
    return new TemplateBuild(r.data, config);
  }

  /** A template's catalog entry (NotFoundError when unknown). */
  static async get(templateId: string, opts: Opts = {}): Promise<TemplateInfo> {
    const r = await request(configOf(opts), 'GET', `/templates/${enc(templateId)}`, { signal: opts.signal });
    return camelize<TemplateInfo>(r.data);
  }

  /** The catalog: every template the workspace may start (the built-in ones and its own). */
  static async list(opts: Opts = {}): Promise<TemplateInfo[]> {
    const r = await request(configOf(opts), 'GET', '/templates', { signal: opts.signal });
    const list = Array.isArray(r.data) ? r.data : (r.data?.templates ?? []);
    return list.map((raw: unknown) => camelize<TemplateInfo>(raw));
  }

  /** A template's builds, newest first, every page followed (their logs are not included). */
  static async builds(templateId: string, opts: ListOptions = {}): Promise<TemplateBuildInfo[]> {
    const config = configOf(opts);
    const data = await listAll(config, `/templates/${enc(templateId)}/builds`, { limit: opts.limit }, opts.signal);
    return data.map((raw) => camelize<TemplateBuildInfo>(raw));
  }

  /** A build of a template, as it stands (its whole log). */
  static async getBuild(templateId: string, buildId: string, opts: Opts = {}): Promise<TemplateBuildInfo> {
    const r = await request(configOf(opts), 'GET', `/templates/${enc(templateId)}/builds/${enc(buildId)}`, {
      signal: opts.signal,
    });
    return camelize(r.data);
  }

  /**
   * Deletes one of the workspace's templates (ConflictError while sandboxes or snapshots use
   * it); returns its catalog entry as it was.
   */
  static async delete(templateId: string, opts: Opts = {}): Promise<TemplateInfo> {
    const r = await request(configOf(opts), 'DELETE', `/templates/${enc(templateId)}`, { signal: opts.signal });
    return camelize(r.data);
  }
}

/** A template build in progress: `await build.wait()` for its end. */
export class TemplateBuild {
  /** The connection it was started with. */
  readonly config: ConnectionConfig;
  /** The build as last read; its `log` is the whole log read so far. */
  info!: TemplateBuildInfo;
  private _log = '';
  private _offset = 0;

  /** Wraps a build as the API answers it. */
  constructor(raw: Record<string, unknown>, opts?: ConnectionOptions | ConnectionConfig) {
    this.config = configOf(opts);
    this._update(raw);
  }

  private _update(raw: unknown): string {
    const info = camelize<TemplateBuildInfo>(raw);
    const piece = info.log ?? '';
    this._log += piece;
    this._offset = (info.logOffset ?? 0) + new TextEncoder().encode(piece).length;
    this.info = { ...info, log: this._log, logOffset: 0 };
    return piece;
  }

  get id(): string {
    return this.info.id;
  }

  get templateId(): string {
    return this.info.templateId;
  }

  /** queued, building, ready or failed. */
  get state(): TemplateBuildInfo['state'] {
    return this.info.state;
  }

  /** The whole log read so far. */
  get log(): string {
    return this._log;
  }

  /** Reads the build again (only the log written since); `onLog` gets the new piece. */
  async refresh(opts: { onLog?: BuildWaitOptions['onLog']; signal?: AbortSignal } = {}): Promise<TemplateBuildInfo> {
    const path = `/templates/${enc(this.templateId)}/builds/${enc(this.id)}`;
    const r = await request(this.config, 'GET', path, { query: { log_offset: this._offset }, signal: opts.signal });
    const piece = this._update(r.data);
    if (piece && opts.onLog) await opts.onLog(piece);
    return this.info;
  }

  /**
   * Polls until the build is `ready` or `failed` and returns it (its `log` whole). `onLog`
   * gets the log piece by piece as it comes; `check: true` throws TemplateBuildError for a
   * failed build; TimeoutError after `timeoutMs` (default 30 minutes).
   */
  async wait(opts: BuildWaitOptions = {}): Promise<TemplateBuildInfo> {
    const timeoutMs = opts.timeoutMs ?? 1_800_000;
    const intervalMs = opts.intervalMs ?? 250;
    const deadline = Date.now() + timeoutMs;
    if (this._log && opts.onLog) await opts.onLog(this._log);
    while (this.state !== 'ready' && this.state !== 'failed') {
      if (Date.now() >= deadline) {
        throw new TimeoutError(`build ${this.id} of ${this.templateId} was not finished after ${timeoutMs} ms`, {
          code: 'TIMEOUT',
        });
      }
      await sleep(intervalMs);
      await this.refresh(opts);
    }
    if (opts.check && this.state === 'failed') throw new TemplateBuildError(this.info);
    return this.info;
  }
}
