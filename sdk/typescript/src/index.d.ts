/// <reference lib="esnext.disposable" />
// Type declarations of @cella/sdk (hand-written; the package is plain ESM JavaScript).

// ---------------------------------------------------------------------------------------------
// Connection

/** Connection options; each may be mixed into the options of create(), connect() and list(). */
export interface ConnectionOptions {
  /** The server's base URL. Default: `CELLA_SERVER`, else `http://127.0.0.1:7070`. */
  server?: string;
  /** The API key. Default: `CELLA_API_KEY`. */
  apiKey?: string;
  /** How many times a 429 is retried after its `Retry-After` (default 3). */
  maxRetries?: number;
  /** Client-side limit of an ordinary request in ms (default 60000); 0 for none. */
  requestTimeoutMs?: number;
  /** Extra headers sent with every request (e.g. `x-request-id`). */
  headers?: Record<string, string>;
  /** A fetch implementation (default: the global fetch). */
  fetch?: typeof fetch;
}

export declare const DEFAULT_SERVER: string;

export declare class ConnectionConfig {
  constructor(opts?: ConnectionOptions | ConnectionConfig);
  readonly server: string;
  readonly apiKey: string | null;
  readonly maxRetries: number;
  readonly requestTimeoutMs: number;
  readonly headers: Record<string, string>;
  readonly fetch: typeof fetch | null;
  toOptions(): ConnectionOptions;
  with(opts: ConnectionOptions): ConnectionConfig;
}

// ---------------------------------------------------------------------------------------------
// Errors

export interface CellaErrorFields {
  code?: string;
  details?: any;
  status?: number | null;
  requestId?: string | null;
  retryAfter?: number | null;
  cause?: unknown;
}

/** Every error envelope `{"error": {code, message, details}}` becomes one of these. */
export declare class CellaError extends Error {
  constructor(message: string, fields?: CellaErrorFields);
  /** Upper-snake code, e.g. `NOT_FOUND`; `CONNECTION`/`TIMEOUT` for client-side failures. */
  readonly code: string;
  /** The envelope's `details`. */
  readonly details: Record<string, any> | null;
  /** The HTTP status (null when no response came). */
  readonly status: number | null;
  /** The response's `x-request-id`. */
  readonly requestId: string | null;
}
export declare class InvalidRequestError extends CellaError {
  /** `details.field`: the field the server named. */
  readonly field: string | null;
}
export declare class UnknownLanguageError extends InvalidRequestError {}
export declare class SizeUnavailableError extends InvalidRequestError {}
export declare class AuthenticationError extends CellaError {}
export declare class InsufficientFundsError extends CellaError {}
export declare class PermissionDeniedError extends CellaError {}
export declare class NotFoundError extends CellaError {}
export declare class MethodNotAllowedError extends CellaError {}
export declare class ConflictError extends CellaError {}
export declare class SandboxNotRunningError extends CellaError {}
export declare class PayloadTooLargeError extends CellaError {}
export declare class RangeNotSatisfiableError extends CellaError {}
export declare class RateLimitedError extends CellaError {
  /** Seconds the server asked to wait. */
  readonly retryAfter: number | null;
}
export declare class ConcurrencyLimitError extends RateLimitedError {}
export declare class InternalServerError extends CellaError {}
export declare class UnavailableError extends CellaError {}
export declare class ConnectionError extends CellaError {}
export declare class TimeoutError extends CellaError {}
/** A build waited for with `check: true` ended `failed` (code `BUILD_FAILED`). */
export declare class TemplateBuildError extends CellaError {
  constructor(build: TemplateBuildInfo | string, fields?: CellaErrorFields);
  readonly build: TemplateBuildInfo | null;
}

// ---------------------------------------------------------------------------------------------
// Sandboxes

export type SandboxState = 'provisioning' | 'running' | 'paused' | 'stopped' | 'destroyed' | 'error';
export type SandboxSize = 'xs' | 'small' | 'medium' | 'large' | 'xl';

export interface NetworkPolicy {
  /** `allow` (default): public addresses open; `deny`: only what `allow` names. */
  egress?: 'allow' | 'deny';
  /** IPv4 addresses, CIDRs or domain names opened (at most 64). */
  allow?: string[];
  /** IPv4 addresses, CIDRs or domain names closed; wins over `allow` (at most 64). */
  deny?: string[];
}

export interface ResourceContract {
  contractId: string;
  contractVersion: string;
  product: string;
  size: SandboxSize;
  vcpus: number;
  memoryMb: number;
  diskSizeMb: number;
}

/** A sandbox as the server describes it. */
export interface SandboxInfo {
  id: string;
  /** Alias of `id`. */
  sandboxId: string;
  tenantId: string;
  ownerId: string;
  templateId: string;
  state: SandboxState;
  size: SandboxSize;
  resourceContract: ResourceContract;
  cpuCount: number;
  memoryMb: number;
  diskSizeMb: number;
  ready: boolean;
  readyAt: Date | null;
  startedAt: Date | null;
  previewUrl: string | null;
  timeoutSec: number;
  timeoutRemainingMs: number | null;
  alwaysOn: boolean;
  persistent: boolean;
  idleTimeoutSec: number;
  totalRuntimeSec: number | null;
  metadata: Record<string, string>;
  createdAt: Date;
  destroyedAt: Date | null;
  stateReason: string | null;
  network: Required<NetworkPolicy>;
  /** Compute price per running second, a decimal string (`"0.000100"`): the workspace's rate when it was created. */
  computeRate: string;
  /** Compute charged so far (at least 60 s x rate once it started), final once destroyed; a decimal string. */
  computeCost: string;
  /** What its model gateway requests cost, a decimal string. */
  modelCost: string;
  [field: string]: unknown;
}

export interface SandboxCreateOptions extends ConnectionOptions {
  /** Template id (default `base`). */
  template?: string;
  /** Size (default: the template's, `small`). */
  size?: SandboxSize;
  /** Active-session timeout in seconds, 1-86400 (default 3600). */
  timeoutSec?: number;
  /** The same in milliseconds (rounded up to whole seconds), as other SDKs spell it. */
  timeoutMs?: number;
  /** Idle timer in seconds, 0-86400 (0: none). */
  idleTimeoutSec?: number;
  /** Pauses at its timeout and can be stopped (default true); else destroyed at its timeout. */
  persistent?: boolean;
  /** No timeout and no idle timer (default false). */
  alwaysOn?: boolean;
  /** String map, filterable in list(). */
  metadata?: Record<string, string>;
  /** Environment of every command in the sandbox. */
  env?: Record<string, string>;
  /** Alias of `env`. */
  envs?: Record<string, string>;
  /** Preview access: `{public: false}` needs the preview token. */
  preview?: { public?: boolean };
  /** Preview traffic resumes the sandbox when it is paused (default false). */
  autoResume?: boolean;
  /** Egress policy. */
  network?: NetworkPolicy;
  /** Wait until it runs (default true); false answers at once in `provisioning`. */
  wait?: boolean;
  /** Compatibility fields: all three together, matching one size's contract. */
  cpuCount?: number;
  memoryMb?: number;
  diskSizeMb?: number;
  /** Start from a snapshot's files (its template and size). */
  snapshotId?: string;
  signal?: AbortSignal;
}

export interface SandboxConnectOptions extends ConnectionOptions {
  /** Resume a paused or stopped sandbox (default true). */
  resume?: boolean;
}

/** A sandbox listing: iterate it with `for await` (pages fetched as needed), or await it. */
export declare class SandboxPaginator implements PromiseLike<SandboxInfo[]>, AsyncIterable<SandboxInfo> {
  [Symbol.asyncIterator](): AsyncIterator<SandboxInfo>;
  all(): Promise<SandboxInfo[]>;
  then<A = SandboxInfo[], B = never>(
    onfulfilled?: ((value: SandboxInfo[]) => A | PromiseLike<A>) | null,
    onrejected?: ((reason: unknown) => B | PromiseLike<B>) | null,
  ): Promise<A | B>;
  catch<B = never>(onrejected?: ((reason: unknown) => B | PromiseLike<B>) | null): Promise<SandboxInfo[] | B>;
  finally(onfinally?: (() => void) | null): Promise<SandboxInfo[]>;
}

export interface SandboxListOptions extends ConnectionOptions {
  /** One state, or `all`; default: live ones (not destroyed or error). */
  state?: SandboxState | 'all';
  /** Every entry must match exactly. */
  metadata?: Record<string, string>;
  /** Page size (1-1000); every page is fetched. */
  limit?: number;
  signal?: AbortSignal;
}

export interface ForkOptions {
  /** How many forks, 1-10 (default 1). */
  count?: number;
  metadata?: Record<string, string>;
}

export interface SandboxUsage {
  sandboxId: string;
  state: SandboxState;
  runningSec: number;
  pausedSec: number;
  billedSec: number;
  cpuSec: number;
  memoryMibSec: number;
  memoryMibNow: number | null;
  measuredAt: Date;
  [field: string]: unknown;
}

export declare class Sandbox {
  /**
   * Wraps a sandbox by id without a request; prefer `Sandbox.create()` / `Sandbox.connect()`.
   */
  constructor(info: { id: string } & Partial<SandboxInfo>, opts?: ConnectionOptions | ConnectionConfig);

  static create(opts?: SandboxCreateOptions): Promise<Sandbox>;
  static create(template: string, opts?: SandboxCreateOptions): Promise<Sandbox>;
  /** Connects to a sandbox, resuming it if it is paused or stopped (unless `resume: false`). */
  static connect(sandboxId: string, opts?: SandboxConnectOptions): Promise<Sandbox>;
  /** The workspace's sandboxes, newest first, every page followed. */
  /** Lazy (`for await`, a page at a time) or awaited whole (an array). Live sandboxes unless `state` says. */
  static list(opts?: SandboxListOptions): SandboxPaginator;
  /** A one-shot run: create, write files, run, keep artifacts, destroy, in one request. */
  static run(opts: SandboxRunOptions): Promise<RunResult>;
  static run(command: string | string[], opts?: SandboxRunOptions): Promise<RunResult>;
  /** Destroys a sandbox by id. */
  static kill(sandboxId: string, opts?: ConnectionOptions): Promise<SandboxInfo>;

  readonly config: ConnectionConfig;
  readonly id: string;
  readonly sandboxId: string;
  /** The sandbox as last read. */
  readonly info: SandboxInfo;
  readonly state: SandboxState;
  readonly commands: Commands;
  readonly files: Files;
  readonly code: CodeInterpreter;

  refresh(): Promise<SandboxInfo>;
  getInfo(): Promise<SandboxInfo>;
  pause(): Promise<SandboxInfo>;
  resume(): Promise<SandboxInfo>;
  stop(): Promise<SandboxInfo>;
  /** Destroys the sandbox (idempotent). */
  kill(): Promise<SandboxInfo>;
  /** Sets the active-session timeout (seconds, 1-86400). */
  setTimeout(timeoutSec: number): Promise<SandboxInfo>;
  usage(): Promise<SandboxUsage>;
  fork(opts?: ForkOptions): Promise<Sandbox[]>;
  /** Copies the sandbox's files into a snapshot. */
  createSnapshot(): Promise<SnapshotInfo>;
  /** Keeps files of the running sandbox (globs or paths) as artifacts. */
  collectArtifacts(paths: string[]): Promise<ArtifactInfo[]>;
  /** Exposes a port through the preview proxy; resolves to its URL. */
  expose(port: number): Promise<string>;
  /** `<port>-<id>.<domain>[:port]`: the host of the port's own preview origin (E2B's getHost). */
  getHost(port: number): Promise<string>;
  runCode(code: string, opts?: RunCodeOptions): Promise<Execution>;
  /** Destroys the sandbox: `await using sb = await Sandbox.create()`. */
  [Symbol.asyncDispose](): Promise<void>;
}

// ---------------------------------------------------------------------------------------------
// Commands

export type User = 'user' | 'root';

/**
 * Every options object is checked: an option a call does not take is a TypeError naming it.
 */
export interface CommandOptions {
  env?: Record<string, string>;
  /** Alias of `env`. */
  envs?: Record<string, string>;
  /** Absolute working directory (default: the user's home). */
  cwd?: string;
  /** `user` (uid 1000, default) or `root`. */
  user?: User;
  /** Output as it comes (run: streams over SSE; start: follows the output). */
  onStdout?: (data: string) => void | Promise<void>;
  onStderr?: (data: string) => void | Promise<void>;
  signal?: AbortSignal;
}

export interface RunOptions extends CommandOptions {
  /** Seconds, 1-86400 (default 3600); the command's tree is killed after it. */
  timeoutSec?: number;
  /** The same in milliseconds (rounded up to whole seconds). */
  timeoutMs?: number;
  /** Text written to standard input, which is then closed. */
  stdin?: string;
  /** Start in the background and return the handle (see start()). */
  background?: boolean;
  /** Client-side limit in ms (default: timeoutSec plus 30 s). */
  requestTimeoutMs?: number | null;
}

export interface StartOptions extends CommandOptions {
  /** A label shown in list(). */
  tag?: string;
}

export interface CommandResult {
  /** Exit status, or 128 + N when signal N killed it. */
  exitCode: number;
  stdout: string;
  stderr: string;
  durationMs: number | null;
  timedOut: boolean;
  stdoutTruncated: boolean;
  stderrTruncated: boolean;
}

export interface ProcessInfo {
  pid: number;
  argv: string[];
  tag: string | null;
  user: User;
  cwd: string;
  state: 'running' | 'exited';
  exitCode: number | null;
  startedAt: Date;
  endedAt: Date | null;
  outputDroppedBytes: number;
  [field: string]: unknown;
}

export interface OutputChunk {
  type: 'stdout' | 'stderr';
  /** The bytes as text (bytes that are not UTF-8 show as U+FFFD). */
  data: string;
  bytes: Uint8Array;
}

export type Signal = string | number;

export declare class Commands {
  /** Runs a shell line (or an argv array) to its end; a non-zero exit is not an error. */
  run(cmd: string | string[], opts: RunOptions & { background: true }): Promise<CommandHandle>;
  run(cmd: string | string[], opts?: RunOptions): Promise<CommandResult>;
  /** Starts a background process. */
  start(cmd: string | string[], opts?: StartOptions): Promise<CommandHandle>;
  connect(pid: number, opts?: Pick<CommandOptions, 'onStdout' | 'onStderr' | 'signal'>): Promise<CommandHandle>;
  list(): Promise<ProcessInfo[]>;
  /** Signals a process (default SIGKILL); false if it had already exited. */
  kill(pid: number, signal?: Signal): Promise<boolean>;
  sendStdin(pid: number, data: string | Uint8Array | ArrayBuffer | Blob, opts?: { close?: boolean }): Promise<ProcessInfo>;
}

export declare class CommandHandle implements AsyncIterable<OutputChunk> {
  /** Wraps a process by pid without a request; prefer `commands.start()` / `commands.connect()`. */
  constructor(sandbox: Sandbox, info: { pid: number } & Partial<ProcessInfo>);
  readonly pid: number;
  readonly tag: string | null;
  /** The process as last read. */
  readonly info: ProcessInfo;
  /** Its exit code once known, else null. */
  readonly exitCode: number | null;
  refresh(): Promise<ProcessInfo>;
  /** Follows the output until exit (`from: 'now'` skips what came before). */
  output(opts?: { from?: 'start' | 'now'; signal?: AbortSignal }): AsyncGenerator<OutputChunk, void, undefined>;
  [Symbol.asyncIterator](): AsyncIterator<OutputChunk>;
  /** Waits for the exit; the result holds what the output buffer (1 MiB) still has. */
  wait(opts?: Pick<CommandOptions, 'onStdout' | 'onStderr' | 'signal'>): Promise<CommandResult>;
  /** Signals it (default SIGKILL); false if it had already exited. */
  kill(signal?: Signal): Promise<boolean>;
  sendStdin(data: string | Uint8Array | ArrayBuffer | Blob, opts?: { close?: boolean }): Promise<ProcessInfo>;
  closeStdin(): Promise<ProcessInfo>;
}

// ---------------------------------------------------------------------------------------------
// Files

export interface EntryInfo {
  name: string;
  path: string;
  type: 'file' | 'dir' | 'symlink' | 'other';
  size: number;
  /** Permission bits in octal, e.g. `"0644"`. */
  mode: string;
  modifiedAt: Date;
  uid: number;
  gid: number;
  symlinkTarget: string | null;
  [field: string]: unknown;
}

export type FileData =
  | string
  | ArrayBuffer
  | ArrayBufferView
  | Blob
  | ReadableStream<Uint8Array>
  | AsyncIterable<Uint8Array | string>;

export interface ReadOptions {
  /** A byte range: `{start, end}` (end inclusive) or a string like `"10-"`, `"-100"`. */
  range?: { start: number; end?: number } | string;
  signal?: AbortSignal;
}

export interface WriteOptions {
  /** Owner of the file and of the directories made for it (default `user`). */
  user?: User;
  /** Permission bits: `0o755` or `"0755"` (default `0644`). */
  mode?: number | string;
  signal?: AbortSignal;
  requestTimeoutMs?: number | null;
}

export interface FilesystemEvent {
  type: 'create' | 'modify' | 'delete' | 'rename';
  path: string;
  dir: boolean;
  /** For `rename`: where it was. */
  from?: string;
}

export interface WatchOptions {
  recursive?: boolean;
  onEvent?: (event: FilesystemEvent) => void | Promise<void>;
  onError?: (error: unknown) => void;
  signal?: AbortSignal;
}

export declare class WatchHandle implements AsyncIterable<FilesystemEvent> {
  readonly path: string;
  [Symbol.asyncIterator](): AsyncIterator<FilesystemEvent>;
  stop(): Promise<void>;
  [Symbol.asyncDispose](): Promise<void>;
}

export declare class Files {
  read(path: string, opts?: ReadOptions & { format?: 'text' }): Promise<string>;
  read(path: string, opts: ReadOptions & { format: 'bytes' }): Promise<Uint8Array>;
  read(path: string, opts: ReadOptions & { format: 'blob' }): Promise<Blob>;
  read(path: string, opts: ReadOptions & { format: 'stream' }): Promise<ReadableStream<Uint8Array>>;
  write(path: string, data: FileData, opts?: WriteOptions): Promise<EntryInfo>;
  write(files: Array<{ path: string; data: FileData } & WriteOptions>, opts?: WriteOptions): Promise<EntryInfo[]>;
  list(path: string, opts?: { recursive?: boolean; limit?: number }): Promise<EntryInfo[] & { readonly truncated: boolean }>;
  remove(path: string, opts?: { recursive?: boolean }): Promise<void>;
  makeDir(path: string): Promise<EntryInfo>;
  rename(from: string, to: string): Promise<EntryInfo>;
  exists(path: string): Promise<boolean>;
  stat(path: string): Promise<EntryInfo>;
  getInfo(path: string): Promise<EntryInfo>;
  watch(path: string, opts?: WatchOptions): Promise<WatchHandle>;
}

// ---------------------------------------------------------------------------------------------
// Code interpreter

export type Language = 'python' | 'javascript' | (string & {});

export interface RunCodeOptions {
  /** `python` (default) or `javascript`. */
  language?: Language;
  /** The persistent namespace (default `default`). */
  context?: string;
  /** Seconds (default and cap 300); past it the cell is interrupted, the context survives. */
  timeout?: number;
  /** Alias of `timeout`, as commands spell it. */
  timeoutSec?: number;
  /** The same in milliseconds. */
  timeoutMs?: number;
  signal?: AbortSignal;
  requestTimeoutMs?: number | null;
}

export interface ExecutionError {
  name: string;
  value: string;
  traceback: string;
}

export interface OutputData {
  mime: string;
  /** Text, or base64 for binary types such as `image/png`. */
  data: string;
}

export declare class Execution {
  readonly ok: boolean;
  readonly stdout: string;
  readonly stderr: string;
  /** The last expression's value as the REPL shows it, else null. */
  readonly result: string | null;
  /** Alias of `result`. */
  readonly text: string | null;
  readonly language: string | null;
  readonly error: ExecutionError | null;
  readonly outputs: OutputData[];
  readonly restarted: boolean;
  toJSON(): Record<string, unknown>;
}

export interface KernelInfo {
  language: string;
  running: boolean;
  busy: boolean;
  contexts: string[];
}

export declare class CodeInterpreter {
  run(code: string, opts?: RunCodeOptions): Promise<Execution>;
  state(): Promise<{ kernels: KernelInfo[] }>;
  contexts(opts?: { language?: Language }): Promise<Array<{ name: string; language: string }>>;
  createContext(opts?: { language?: Language; context?: string }): Promise<{ name: string; language: string; created: boolean }>;
  resetContext(context: string, opts?: { language?: Language }): Promise<{ name: string; language: string; existed: boolean }>;
  reset(opts?: { language?: Language }): Promise<{ kernels: KernelInfo[] }>;
}

// ---------------------------------------------------------------------------------------------
// Snapshots, one-shot runs and artifacts, custom templates

export interface SnapshotInfo {
  id: string;
  sandboxId: string;
  templateId: string;
  size: SandboxSize;
  createdAt: Date;
  /** Bytes the snapshot takes on the host. */
  sizeBytes: number;
  [field: string]: unknown;
}

export interface ListOptions extends ConnectionOptions {
  /** Page size (1-1000); every page is fetched. */
  limit?: number;
  signal?: AbortSignal;
}

export declare class Snapshot {
  static list(opts?: ListOptions): Promise<SnapshotInfo[]>;
  static get(snapshotId: string, opts?: ConnectionOptions & { signal?: AbortSignal }): Promise<SnapshotInfo>;
  static delete(snapshotId: string, opts?: ConnectionOptions & { signal?: AbortSignal }): Promise<SnapshotInfo>;
}

export type ArtifactFormat = 'bytes' | 'text' | 'blob' | 'stream';
export interface DownloadOptions extends ConnectionOptions {
  /** Default `bytes` (a Uint8Array). */
  format?: ArtifactFormat;
  signal?: AbortSignal;
}

export interface ArtifactInfo {
  id: string;
  sandboxId: string;
  /** The file's absolute path in its sandbox. */
  path: string;
  size: number;
  /** Where to download it with an API key. */
  url: string;
  createdAt: Date;
  expiresAt: Date;
  /** Downloads it (on the connection it was read with). */
  read(opts?: { format?: 'bytes' }): Promise<Uint8Array>;
  read(opts: { format: 'text' }): Promise<string>;
  read(opts: { format: 'blob' }): Promise<Blob>;
  read(opts: { format: 'stream' }): Promise<ReadableStream<Uint8Array>>;
  [field: string]: unknown;
}

export declare class Artifact {
  static list(opts?: ListOptions & { sandboxId?: string }): Promise<ArtifactInfo[]>;
  static download(artifact: string | ArtifactInfo, opts?: DownloadOptions & { format?: 'bytes' }): Promise<Uint8Array>;
  static download(artifact: string | ArtifactInfo, opts: DownloadOptions & { format: 'text' }): Promise<string>;
  static download(artifact: string | ArtifactInfo, opts: DownloadOptions & { format: 'blob' }): Promise<Blob>;
  static download(artifact: string | ArtifactInfo, opts: DownloadOptions & { format: 'stream' }): Promise<ReadableStream<Uint8Array>>;
  static delete(artifact: string | ArtifactInfo, opts?: ConnectionOptions & { signal?: AbortSignal }): Promise<ArtifactInfo>;
}

export interface RunFile {
  /** Absolute, or relative to `cwd`. */
  path: string;
  content: string;
  encoding?: 'utf8' | 'base64';
}

export interface SandboxRunOptions extends ConnectionOptions {
  /** A shell line; or `argv`. */
  command?: string;
  argv?: string[];
  /** Written before the command: a list, or a map of path to text or bytes. */
  files?: RunFile[] | Record<string, string | Uint8Array>;
  /** Globs of files to keep (at most 64), relative to `cwd`. */
  artifacts?: string[];
  /** The command's timeout in seconds (default 3600). */
  timeoutSec?: number;
  env?: Record<string, string>;
  cwd?: string;
  user?: User;
  stdin?: string;
  template?: string;
  size?: SandboxSize;
  metadata?: Record<string, string>;
  network?: NetworkPolicy;
  /** Client-side limit in ms (default: timeoutSec plus margins). */
  requestTimeoutMs?: number;
  signal?: AbortSignal;
}

export interface RunResult {
  exitCode: number;
  stdout: string;
  stderr: string;
  durationMs: number;
  timedOut: boolean;
  /** The run's sandbox, destroyed by now. */
  sandboxId: string;
  artifacts: ArtifactInfo[];
  [field: string]: unknown;
}

export interface TemplateSpec {
  /** 1-40 lowercase letters, digits and `-`, starting with a letter. */
  id: string;
  name?: string;
  from?: string;
  image?: string;
  steps?: Array<
    | { run: string }
    | { copy: { src: string; dest: string; mode?: number } }
    | { env: Record<string, string> }
    | { workdir: string }
    | { user: User }
  >;
  files?: Record<string, { content: string; encoding?: 'utf8' | 'base64' }>;
  start?: string;
  port?: number;
  ready?: { command?: string; port?: number; timeoutSec?: number; [field: string]: unknown };
  default_size?: SandboxSize;
  warm?: number;
  [field: string]: unknown;
}

export interface TemplateInfo {
  id: string;
  name: string;
  defaultSize: SandboxSize;
  readiness: string;
  sizes: Array<{ size: SandboxSize; state: string; resourceContract?: ResourceContract }>;
  [field: string]: unknown;
}

export interface BuildStep {
  index: number;
  kind: 'run' | 'copy' | 'env' | 'workdir' | 'user' | 'image';
  state: 'pending' | 'running' | 'done' | 'cached' | 'failed';
  durationMs: number | null;
}

export interface TemplateBuildInfo {
  id: string;
  templateId: string;
  state: 'queued' | 'building' | 'ready' | 'failed';
  steps: BuildStep[];
  log: string;
  logOffset: number;
  error: string | null;
  createdAt: Date;
  finishedAt: Date | null;
  [field: string]: unknown;
}

export interface BuildWaitOptions {
  /** Each new piece of the log as it comes. */
  onLog?: (text: string) => void | Promise<void>;
  /** Throw TemplateBuildError for a failed build. */
  check?: boolean;
  /** Default 30 minutes. */
  timeoutMs?: number;
  /** Poll interval (default 250). */
  intervalMs?: number;
  signal?: AbortSignal;
}

export declare class Template {
  static build(spec: TemplateSpec, opts?: ConnectionOptions & { signal?: AbortSignal }): Promise<TemplateBuild>;
  static get(templateId: string, opts?: ConnectionOptions & { signal?: AbortSignal }): Promise<TemplateInfo>;
  static getBuild(templateId: string, buildId: string, opts?: ConnectionOptions & { signal?: AbortSignal }): Promise<TemplateBuildInfo>;
  static delete(templateId: string, opts?: ConnectionOptions & { signal?: AbortSignal }): Promise<TemplateInfo>;
}

/** A template build in progress. */
export declare class TemplateBuild {
  constructor(raw: Record<string, unknown>, opts?: ConnectionOptions | ConnectionConfig);
  readonly config: ConnectionConfig;
  readonly id: string;
  readonly templateId: string;
  readonly state: TemplateBuildInfo['state'];
  /** The build as last read, its `log` whole. */
  readonly info: TemplateBuildInfo;
  /** The whole log read so far. */
  readonly log: string;
  refresh(opts?: { onLog?: BuildWaitOptions['onLog']; signal?: AbortSignal }): Promise<TemplateBuildInfo>;
  wait(opts?: BuildWaitOptions): Promise<TemplateBuildInfo>;
}
