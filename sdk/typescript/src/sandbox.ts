/// <reference lib="esnext.disposable" preserve="true" />
// The Sandbox class: create, connect, list, and everything done to one sandbox.

import './dispose.js';
import { ConnectionConfig, connectionOptions, request, type Query, type RequestOptions } from './http.js';
import { NotFoundError } from './errors.js';
import { camelize, compact, sandboxInfo } from './convert.js';
import { Commands } from './commands.js';
import { Files } from './files.js';
import { CodeInterpreter, type Execution } from './code.js';
import { Pty } from './pty.js';
import { artifactInfo } from './resources.js';
import { checkOptions } from './options.js';
import { bytesToB64 } from './sse.js';
import type {
  ArtifactInfo,
  ConnectionOptions,
  ForkOptions,
  PreviewToken,
  RunCodeOptions,
  RunFile,
  RunResult,
  SandboxConnectOptions,
  SandboxCreateOptions,
  SandboxInfo,
  SandboxListOptions,
  SandboxRunOptions,
  SandboxState,
  SandboxUsage,
  SnapshotInfo,
} from './types.js';

const CREATE_OPTIONS = ['template', 'size', 'cpuCount', 'memoryMb', 'diskSizeMb', 'timeoutSec', 'idleTimeoutSec',
  'persistent', 'alwaysOn', 'metadata', 'env', 'network', 'wait', 'snapshotId', 'preview', 'autoResume', 'runtime'];
const RUN_OPTIONS = ['command', 'argv', 'template', 'size', 'runtime', 'env', 'metadata', 'network', 'files', 'cwd',
  'user', 'stdin', 'timeoutSec', 'artifacts'];

const CREATE_TIMEOUT_MS = 120_000;

function createBody(opts: Record<string, any>) {
  return compact({
    template_id: opts.template,
    size: opts.size,
    cpu_count: opts.cpuCount,
    memory_mb: opts.memoryMb,
    disk_size_mb: opts.diskSizeMb,
    timeout_sec: opts.timeoutSec,
    idle_timeout_sec: opts.idleTimeoutSec,
    persistent: opts.persistent,
    always_on: opts.alwaysOn,
    metadata: opts.metadata,
    env: opts.env,
    network: opts.network,
    wait: opts.wait,
    snapshot_id: opts.snapshotId,
    preview: opts.preview,
    auto_resume: opts.autoResume,
    runtime: opts.runtime,
  });
}

/** A one-shot run's `files`: an array of `{path, content, encoding}`, or a map of path to text or bytes. */
function runFiles(files: SandboxRunOptions['files']): RunFile[] | undefined {
  if (files == null) return undefined;
  if (Array.isArray(files)) return files;
  return Object.entries(files).map(([path, content]) =>
    typeof content === 'string'
      ? { path, content }
      : { path, content: bytesToB64(content), encoding: 'base64' as const },
  );
}

function runBody(opts: Record<string, any>) {
  return compact({
    command: opts.command,
    argv: opts.argv,
    template_id: opts.template,
    size: opts.size,
    runtime: opts.runtime,
    env: opts.env,
    metadata: opts.metadata,
    network: opts.network,
    files: runFiles(opts.files),
    cwd: opts.cwd,
    user: opts.user,
    stdin: opts.stdin,
    timeout_sec: opts.timeoutSec,
    artifacts: opts.artifacts,
  });
}

/**
 * Pages of a sandbox listing, fetched as they are iterated (`for await`); awaiting it gives
 * them all as an array.
 */
export class SandboxPaginator implements PromiseLike<SandboxInfo[]>, AsyncIterable<SandboxInfo> {
  private readonly _config: ConnectionConfig | null;
  private readonly _query: Query | null;
  private readonly _signal: AbortSignal | null | undefined;
  private readonly _error: unknown;

  /** @internal */
  constructor(config: ConnectionConfig | null, query: Query | null, signal?: AbortSignal | null, error: unknown = null) {
    this._config = config;
    this._query = query;
    this._signal = signal;
    this._error = error;
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<SandboxInfo, void, undefined> {
    if (this._error) throw this._error;
    let cursor: string | undefined;
    for (;;) {
      const r = await request(this._config!, 'GET', '/sandboxes', {
        query: { ...this._query, cursor },
        signal: this._signal,
      });
      for (const raw of r.data) yield sandboxInfo(raw);
      if (!r.next_cursor || r.data.length === 0) return;
      cursor = r.next_cursor;
    }
  }

  /** Every sandbox of the listing, following every page. */
  async all(): Promise<SandboxInfo[]> {
    const out: SandboxInfo[] = [];
    for await (const s of this) out.push(s);
    return out;
  }

  then<A = SandboxInfo[], B = never>(
    onfulfilled?: ((value: SandboxInfo[]) => A | PromiseLike<A>) | null,
    onrejected?: ((reason: unknown) => B | PromiseLike<B>) | null,
  ): Promise<A | B> {
    return this.all().then(onfulfilled, onrejected);
  }

  catch<B = never>(onrejected?: ((reason: unknown) => B | PromiseLike<B>) | null): Promise<SandboxInfo[] | B> {
    return this.all().catch(onrejected);
  }

  finally(onfinally?: (() => void) | null): Promise<SandboxInfo[]> {
    return this.all().finally(onfinally);
  }
}

/** A Cella sandbox. Make one with `Sandbox.create()` or `Sandbox.connect(id)`. */
export class Sandbox {
  /** The connection this sandbox (and whatever is made from it) uses. */
  readonly config: ConnectionConfig;
  /** Commands: run to the end, or start in the background. */
  readonly commands: Commands;
  /** The sandbox's filesystem. */
  readonly files: Files;
  /** The code interpreter's contexts and kernels (runCode() runs a cell). */
  readonly code: CodeInterpreter;
  /** Terminals (a WebSocket to a program on a pseudo-terminal). */
  readonly pty: Pty;
  private _info: SandboxInfo;

  /**
   * Wraps a sandbox the caller knows, without a request. Prefer `Sandbox.create()` and
   * `Sandbox.connect()`, which read it from the server.
   */
  constructor(info: { id: string } & Partial<SandboxInfo>, opts: ConnectionOptions | ConnectionConfig = {}) {
    if (!info || typeof info.id !== 'string') throw new TypeError('a sandbox needs an id');
    this.config = opts instanceof ConnectionConfig ? opts : new ConnectionConfig(opts);
    this._info = { ...info, sandboxId: info.id } as SandboxInfo;
    this.commands = new Commands(this);
    this.files = new Files(this);
    this.code = new CodeInterpreter(this);
    this.pty = new Pty(this);
  }

  /** The sandbox's id. */
  get id(): string {
    return this._info.id;
  }

  /** Alias of `id`. */
  get sandboxId(): string {
    return this._info.id;
  }

  /** The sandbox as last read from the server (see refresh()). */
  get info(): SandboxInfo {
    return this._info;
  }

  /** Its state as last read: provisioning, running, paused, stopped, destroyed or error. */
  get state(): SandboxState {
    return this._info.state;
  }

  /** @internal A request on this sandbox's own routes. */
  _request(method: string, subpath: string, opts: RequestOptions & { as: 'response' }): Promise<Response>;
  _request(method: string, subpath: string, opts?: RequestOptions): Promise<import('./http.js').ApiBody>;
  _request(method: string, subpath: string, opts: RequestOptions = {}): Promise<any> {
    return request(this.config, method, `/sandboxes/${encodeURIComponent(this.id)}${subpath}`, opts);
  }

  private _update(raw: unknown): SandboxInfo {
    this._info = sandboxInfo(raw);
    return this._info;
  }

  /**
   * Creates a sandbox and waits until it runs (unless `wait: false`).
   * `Sandbox.create()`, `Sandbox.create({template, size, ...})` or `Sandbox.create('base', {...})`.
   */
  static async create(opts?: SandboxCreateOptions): Promise<Sandbox>;
  static async create(template: string, opts?: SandboxCreateOptions): Promise<Sandbox>;
  static async create(templateOrOpts?: string | SandboxCreateOptions, maybeOpts?: SandboxCreateOptions): Promise<Sandbox> {
    let opts: SandboxCreateOptions;
    if (typeof templateOrOpts === 'string') opts = { ...(maybeOpts ?? {}), template: templateOrOpts };
    else opts = { ...(templateOrOpts ?? {}) };
    opts = checkOptions(opts, CREATE_OPTIONS, 'Sandbox.create');
    const config = new ConnectionConfig(connectionOptions(opts));
    const r = await request(config, 'POST', '/sandboxes', {
      json: createBody(opts),
      signal: opts.signal,
      timeoutMs: opts.requestTimeoutMs ?? Math.max(config.requestTimeoutMs, CREATE_TIMEOUT_MS),
    });
    return new Sandbox(sandboxInfo(r.data), config);
  }

  /**
   * A one-shot run: creates a sandbox, writes `files`, runs `command` (a shell line) or
   * `argv`, keeps the files matching the `artifacts` globs, destroys the sandbox, in one
   * request. `Sandbox.run({command, ...})`, or `Sandbox.run('make', {...})` / `Sandbox.run(['ls', '-l'], {...})`.
   * Resolves to a RunResult whatever the exit code; each artifact has `read()`.
   */
  static async run(opts: SandboxRunOptions): Promise<RunResult>;
  static async run(command: string | string[], opts?: SandboxRunOptions): Promise<RunResult>;
  static async run(commandOrOpts: string | string[] | SandboxRunOptions, maybeOpts?: SandboxRunOptions): Promise<RunResult> {
    let opts: SandboxRunOptions;
    if (typeof commandOrOpts === 'string') opts = { ...(maybeOpts ?? {}), command: commandOrOpts };
    else if (Array.isArray(commandOrOpts)) opts = { ...(maybeOpts ?? {}), argv: commandOrOpts };
    else opts = { ...(commandOrOpts ?? {}) };
    opts = checkOptions(opts, RUN_OPTIONS, 'Sandbox.run');
    const config = new ConnectionConfig(connectionOptions(opts));
    const r = await request(config, 'POST', '/sandboxes/run', {
      json: runBody(opts),
      signal: opts.signal,
      timeoutMs: opts.requestTimeoutMs ?? ((opts.timeoutSec ?? 3600) + 30) * 1000 + CREATE_TIMEOUT_MS,
    });
    const result = camelize<RunResult>({ ...r.data, artifacts: [] });
    result.artifacts = (r.data.artifacts ?? []).map((raw: unknown) => artifactInfo(raw, config));
    return result;
  }

  /**
   * Connects to an existing sandbox. A paused or stopped one is resumed first, unless
   * `resume: false`.
   */
  static async connect(sandboxId: string, opts: SandboxConnectOptions = {}): Promise<Sandbox> {
    opts = checkOptions(opts, ['resume'], 'Sandbox.connect');
    const config = new ConnectionConfig(connectionOptions(opts));
    const sb = new Sandbox({ id: sandboxId }, config);
    await sb.refresh();
    if (opts.resume !== false && (sb.state === 'paused' || sb.state === 'stopped')) await sb.resume();
    return sb;
  }

  /**
   * Lists the workspace's sandboxes, newest first: live ones (not destroyed or failed) unless
   * `state` asks for one (or `'all'`). Filters: `state`, `metadata` (every entry must match);
   * `limit` is the page size. Lazy: `for await (const s of Sandbox.list())` fetches a page at
   * a time as it goes; `await Sandbox.list()` gives every one as an array.
   * @returns {SandboxPaginator} of SandboxInfo objects
   */
  static list(opts: SandboxListOptions = {}): SandboxPaginator {
    try {
      opts = checkOptions(opts, ['state', 'limit', 'metadata'], 'Sandbox.list');
    } catch (e) {
      return new SandboxPaginator(null, null, null, e);
    }
    const config = new ConnectionConfig(connectionOptions(opts));
    const query: Query = { state: opts.state, limit: opts.limit };
    for (const [k, v] of Object.entries(opts.metadata ?? {})) query[`metadata.${k}`] = v;
    return new SandboxPaginator(config, query, opts.signal);
  }

  /** Destroys a sandbox by id; returns its SandboxInfo, now destroyed. */
  static async kill(sandboxId: string, opts: ConnectionOptions = {}): Promise<SandboxInfo> {
    return new Sandbox({ id: sandboxId }, connectionOptions(opts)).kill();
  }

  /** Reads the sandbox again; returns its SandboxInfo. */
  async refresh(): Promise<SandboxInfo> {
    const r = await this._request('GET', '');
    return this._update(r.data);
  }

  /** Alias of refresh(). */
  async getInfo(): Promise<SandboxInfo> {
    return this.refresh();
  }

  /** Freezes every process (memory kept). */
  async pause(): Promise<SandboxInfo> {
    const r = await this._request('POST', '/pause');
    return this._update(r.data);
  }

  /** Thaws a paused sandbox, or boots a stopped one again on its kept files. */
  async resume(): Promise<SandboxInfo> {
    const r = await this._request('POST', '/resume', { timeoutMs: Math.max(this.config.requestTimeoutMs, CREATE_TIMEOUT_MS) });
    return this._update(r.data);
  }

  /** Ends every process and keeps the files (persistent sandboxes); resume() boots it again. */
  async stop(): Promise<SandboxInfo> {
    const r = await this._request('POST', '/stop');
    return this._update(r.data);
  }

  /** Destroys the sandbox (idempotent); returns its SandboxInfo, now destroyed. */
  async kill(): Promise<SandboxInfo> {
    const r = await this._request('DELETE', '');
    return this._update(r.data);
  }

  /** Sets the active-session timeout; on a running sandbox the timer starts again from now. */
  async setTimeout(timeoutSec: number): Promise<SandboxInfo> {
    const r = await this._request('POST', '/timeout', { json: { timeout_sec: timeoutSec } });
    return this._update(r.data);
  }

  /** Running, paused and billed time, CPU and memory used. */
  async usage(): Promise<SandboxUsage> {
    const r = await this._request('GET', '/usage');
    return camelize<SandboxUsage>(r.data);
  }

  /** Forks the sandbox into `count` (1-10) new ones; returns them. */
  async fork(opts: ForkOptions = {}): Promise<Sandbox[]> {
    const r = await this._request('POST', '/fork', { json: compact({ count: opts.count, metadata: opts.metadata }) });
    const list = Array.isArray(r.data) ? r.data : [r.data];
    return list.map((raw: unknown) => new Sandbox(sandboxInfo(raw), this.config));
  }

  /**
   * Copies the sandbox's files into a snapshot; `Sandbox.create({snapshotId})` starts new
   * sandboxes from it. With `memory: true` (gVisor sandboxes) its memory and processes too:
   * sandboxes made from it continue where it was. Returns the SnapshotInfo.
   */
  async createSnapshot(options: { memory?: boolean } = {}): Promise<SnapshotInfo> {
    const r = await this._request(
      'POST',
      '/snapshots',
      options.memory === undefined ? {} : { json: { memory: options.memory } },
    );
    return camelize<SnapshotInfo>(r.data);
  }

  /** Keeps files of the running sandbox (globs or paths) as artifacts; returns them. */
  async collectArtifacts(paths: string[]): Promise<ArtifactInfo[]> {
    const r = await this._request('POST', '/artifacts', { json: { paths } });
    return r.data.map((raw: unknown) => artifactInfo(raw, this.config));
  }

  /**
   * Exposes a port of the sandbox through the server's preview proxy; returns its URL (the
   * path form on the server's address while the server's preview domain is `localhost`, so
   * that `fetch` opens it; the per-sandbox host name otherwise). Signed when the preview is
   * private.
   */
  async expose(port: number): Promise<string> {
    const r = await this._request('POST', '/expose', { json: { port } });
    return r.data.url;
  }

  /**
   * The host name (and port) of a port's own preview origin, `<port>-<id>.<domain>`, without a
   * scheme (E2B's `getHost`). Browsers open it; programs on a `localhost` preview domain use
   * expose()'s URL.
   */
  async getHost(port: number): Promise<string> {
    const r = await this._request('POST', '/expose', { json: { port } });
    return new URL(r.data.host_url ?? r.data.url).host;
  }

  /**
   * A token for the sandbox's private previews (`{token, expiresAt}`), sent as the
   * `x-cella-preview-token` header or `?cella_preview_token=`. `ttlSec`: how long it is valid;
   * `rotate: true` makes every token handed out before stop working.
   */
  async previewToken(opts: { ttlSec?: number; rotate?: boolean } = {}): Promise<PreviewToken> {
    const r = await this._request('POST', '/preview-token', { json: compact({ ttl_sec: opts.ttlSec, rotate: opts.rotate }) });
    return camelize<PreviewToken>(r.data);
  }

  /** Runs a cell of code in a persistent context; see `sandbox.code.run()`. */
  async runCode(code: string, opts: RunCodeOptions = {}): Promise<Execution> {
    return this.code.run(code, opts);
  }

  /** `await using sb = await Sandbox.create()` destroys it at the end of the scope. */
  async [Symbol.asyncDispose](): Promise<void> {
    try {
      await this.kill();
    } catch (e) {
      if (!(e instanceof NotFoundError)) throw e;
    }
  }
}
