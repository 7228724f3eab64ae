// The public object and option types of @cella/sdk. The objects are the API's, camelCase, with
// times as Dates; test/types checks them against the server's OpenAPI document.

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

// ---------------------------------------------------------------------------------------------
// Errors

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
  /** Who may use its previews: `{public: false}` needs its preview token. */
  preview: { public: boolean };
  /** Preview traffic resumes it when it is paused. */
  autoResume: boolean;
  /** The isolation runtime it runs on: `namespace` or `gvisor`. */
  runtime: string;
  /** Only while paused: where its memory is, `in_ram` (namespace) or `on_disk` (gvisor). */
  memory?: 'in_ram' | 'on_disk' | null;
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
  /** Isolation runtime (default: the template's, then the server's): `gvisor` needs runsc on the server. */
  runtime?: 'namespace' | 'gvisor';
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

/** A preview token of a sandbox. */
export interface PreviewToken {
  token: string;
  expiresAt: Date;
  [field: string]: unknown;
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
  onStdout?: (data: string) => unknown;
  onStderr?: (data: string) => unknown;
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
  durationMs: number;
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
  onEvent?: (event: FilesystemEvent) => unknown;
  onError?: (error: unknown) => void;
  signal?: AbortSignal;
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

export interface KernelInfo {
  language: string;
  running: boolean;
  busy: boolean;
  contexts: string[];
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
  /** Whether it holds the sandbox's memory and processes too (gVisor). */
  memory: boolean;
  [field: string]: unknown;
}

export interface ListOptions extends ConnectionOptions {
  /** Page size (1-1000); every page is fetched. */
  limit?: number;
  signal?: AbortSignal;
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
  /** Isolation runtime of the run's sandbox, as at create. */
  runtime?: 'namespace' | 'gvisor';
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
  /** gVisor: save the first boot of each size (app ready) and restore later creates from it. */
  snapshot_boot?: boolean;
  [field: string]: unknown;
}

/** `fast_ready`: warm sandboxes wait, or a saved boot is restored; `cold_boot_only`: each one boots; `missing`: not on this server. */
export type Readiness = 'fast_ready' | 'cold_boot_only' | 'missing';

export interface TemplateInfo {
  id: string;
  name: string;
  /** What it makes (`sandbox`), and the names the SDKs and the CLI know it by. */
  product: string;
  primitive: string;
  sdkName: string;
  cliName: string;
  defaultSize: SandboxSize;
  readiness: Readiness;
  sizes: Array<{ size: SandboxSize; state: Readiness; resourceContract?: ResourceContract | null }>;
  /** The runtimes its sandboxes can run on on this server, its default first. */
  runtimes: string[];
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
  onLog?: (text: string) => unknown;
  /** Throw TemplateBuildError for a failed build. */
  check?: boolean;
  /** Default 30 minutes. */
  timeoutMs?: number;
  /** Poll interval (default 250). */
  intervalMs?: number;
  signal?: AbortSignal;
}


// ---------------------------------------------------------------------------------------------
// Task runs

export type TaskState = 'queued' | 'provisioning' | 'running' | 'stopped' | 'failed' | 'cancelled';
export type StopReason = 'agent_exit' | 'session_limit' | 'heartbeat_lost' | 'cancelled' | 'server_restart' | 'error';

/** The draft pull (or merge) request a run opened. */
export interface PullRequest {
  number: number;
  url: string;
  draft: boolean;
}

/** A task run as the server describes it. */
export interface TaskInfo {
  id: string;
  workspaceId: string;
  /** The user or API key that started it (`usr_...` / `key_...`). */
  createdBy: string;
  /** `owner/name` as given. */
  repository: string;
  baseBranch: string;
  /** The branch the agent works on: `[tasks] branch_prefix` + the run's id. */
  branch: string;
  forge: string;
  agent: string;
  state: TaskState;
  stopReason: StopReason | null;
  /** `<kind>: <detail>` when `failed`, else null. */
  failureReason: string | null;
  pullRequest: PullRequest | null;
  queuedAt: Date;
  startedAt: Date | null;
  endedAt: Date | null;
  /** Seconds its sandbox ran (billed with a 60-second minimum). */
  computeSec: number;
  /** Decimal strings, e.g. `"0.000100"`. */
  computeRate: string;
  computeCost: string;
  modelCost: string;
  modelRequests: number;
  sessionLimitMin: number;
  metadata: Record<string, string>;
  [field: string]: unknown;
}

export interface TaskStartOptions extends ConnectionOptions {
  /** `owner/name` on the forge (a local path on the embedded local forge). */
  repository: string;
  /** What the agent is asked to do (1 to 65,536 bytes). */
  task: string;
  /** Default: the repository's default branch. */
  baseBranch?: string;
  /** A configured forge's name; default the first. */
  forge?: string;
  /** A configured agent's name; default the first. */
  agent?: string;
  metadata?: Record<string, string>;
  signal?: AbortSignal;
}

export interface TaskListOptions extends ConnectionOptions {
  state?: TaskState;
  repository?: string;
  /** Page size; every page is fetched. */
  limit?: number;
  signal?: AbortSignal;
}

/**
 * One event of a run's `events` stream: `state` (the first is the state it is in now; `data`
 * has `state`, `at` and, at the end, `stopReason`...) or `progress` (counts only).
 */
export interface TaskEvent {
  type: 'state' | 'progress' | (string & {});
  /** The event's data, camelCase. */
  data: Record<string, unknown>;
  /** For `state` events: the state. */
  state?: TaskState;
}

/** A piece of the agent's output from the run's `log` stream. */
export interface TaskLogChunk {
  /** `stdout` or `stderr`. */
  stream: string;
  text: string;
}

export interface TaskWaitOptions {
  /** Every event as it comes. */
  onEvent?: (event: TaskEvent) => unknown;
  signal?: AbortSignal;
}

// ---------------------------------------------------------------------------------------------
// Workspaces: settings, wallet, ledger, usage

export interface WorkspaceSettings {
  tasksEnabled?: boolean;
  /** Compute price per running second (a decimal string). */
  computeRate?: string;
  sessionLimitMin?: number;
  modelAllowlist?: string[];
  heartbeatTimeoutSec?: number;
  /** Where the workspace's task runs' sandboxes run: `namespace` or `gvisor` (absent: `namespace`). */
  taskRuntime?: string | null;
  [field: string]: unknown;
}

export interface WorkspaceInfo {
  id: string;
  name: string;
  plan: Plan;
  kind: 'personal' | 'organization';
  createdAt: Date;
  settings: WorkspaceSettings;
  [field: string]: unknown;
}

export type Plan = 'developer' | 'business' | 'enterprise';

export interface WorkspaceUpdate {
  name?: string;
  plan?: Plan;
  /** Settings to change; the ones not named keep their values. */
  settings?: WorkspaceSettings;
}

/** A workspace's wallet; amounts are decimal strings (exact). */
export interface Wallet {
  /** The sum of every ledger entry. */
  balance: string;
  /** Held for running sandboxes and task runs. */
  reserved: string;
  /** `balance - reserved`. */
  available: string;
  currency: string;
  [field: string]: unknown;
}

export type LedgerKind = 'credit' | 'compute' | 'model' | 'refund';

/** One entry of a workspace's ledger. Fields that do not apply to its kind are absent. */
export interface LedgerEntry {
  id: string;
  at: Date;
  kind: LedgerKind;
  /** Positive for credits and refunds, negative for charges. */
  amount: string;
  balanceAfter: string;
  reference?: string | null;
  sandboxId?: string | null;
  taskId?: string | null;
  computeSec?: number | null;
  computeRate?: string | null;
  model?: string | null;
  inputTokens?: number | null;
  outputTokens?: number | null;
  [field: string]: unknown;
}

export interface UsageFigures {
  computeSec: number;
  computeCost: string;
  modelRequests: number;
  inputTokens: number;
  outputTokens: number;
  modelCost: string;
}

/** A workspace's usage per UTC day in `[from, to)`, oldest first, with totals. */
export interface UsageReport {
  from: Date;
  to: Date;
  currency: string;
  days: Array<UsageFigures & { date: string }>;
  totals: UsageFigures;
  [field: string]: unknown;
}

export interface WorkspaceOptions extends ConnectionOptions {
  /** The workspace (default: the key's own, the first `GET /workspaces` lists). */
  workspaceId?: string;
  signal?: AbortSignal;
}

export interface WorkspaceCreateOptions extends ConnectionOptions {
  name: string;
  kind?: 'personal' | 'organization';
  plan?: Plan;
  signal?: AbortSignal;
}

/** What a workspace stores against its storage quota, in bytes, by kind. */
export interface WorkspaceStorage {
  usedBytes: number;
  /** Null: no quota. */
  quotaBytes: number | null;
  snapshotsBytes: number;
  artifactsBytes: number;
  templatesBytes: number;
  imagesBytes: number;
  [field: string]: unknown;
}

export type Role = 'owner' | 'admin' | 'member';

/** A member of a workspace. */
export interface Member {
  userId: string;
  email: string;
  name: string;
  role: Role;
  [field: string]: unknown;
}

// ---------------------------------------------------------------------------------------------
// API keys

export type Scope =
  | 'sandboxes:read'
  | 'sandboxes:write'
  | 'sandboxes:exec'
  | 'templates:write'
  | 'tasks:read'
  | 'tasks:write'
  | 'models:use'
  | 'admin';

/** An API key (its secret `key` only in the answer that made it). */
export interface ApiKeyInfo {
  id: string;
  workspaceId: string;
  name: string;
  /** The first characters of the key, to recognise it. */
  prefix: string;
  scopes: Scope[];
  /** The secret: only when the key was just made; null otherwise. */
  key: string | null;
  createdAt: Date;
  expiresAt: Date | null;
  lastUsedAt: Date | null;
  [field: string]: unknown;
}

export interface ApiKeyCreateOptions extends ConnectionOptions {
  name: string;
  scopes: Scope[];
  /** Default: the caller's own workspace. */
  workspaceId?: string;
  /** When it stops working (default never). */
  expiresAt?: Date | string;
  signal?: AbortSignal;
}

// ---------------------------------------------------------------------------------------------
// Terminal

/** A WebSocket class like the one Node 22 (and Node 20 with `--experimental-websocket`) has. */
export type WebSocketClass = new (url: string, init?: any) => WebSocket;

export interface PtyOptions {
  /** The terminal's size (default 80 x 24). */
  cols?: number;
  rows?: number;
  /** A shell line to run instead of the login shell. */
  command?: string;
  /** `user` (default) or `root`. */
  user?: User;
  /** Absolute working directory (default: the user's home). */
  cwd?: string;
  /** The terminal's output as it comes (raw bytes). */
  onData?: (data: Uint8Array) => unknown;
  /**
   * The WebSocket class to use (default the global one). It must send headers: the standard
   * browser class cannot send the API key, Node's (undici's) can.
   */
  webSocket?: WebSocketClass;
}

// ---------------------------------------------------------------------------------------------
// Images and users

/** An image imported from an archive, for templates to build on (`image: reference`). */
export interface ImageInfo {
  id: string;
  /** What a template spec names as its `image` (`upload:<id>`). */
  reference: string;
  name: string;
  digest: string;
  layers: number;
  [field: string]: unknown;
}

/** A user (a person who signs in to the console). */
export interface UserInfo {
  id: string;
  email: string;
  name: string;
  createdAt: Date;
  [field: string]: unknown;
}

export interface UserCreateOptions extends ConnectionOptions {
  email: string;
  name: string;
  /** 8 to 1024 bytes. */
  password: string;
  signal?: AbortSignal;
}
