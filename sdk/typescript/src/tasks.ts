// Task runs: an agent works on a repository in a fresh sandbox and hands back a branch (and a
// draft pull request where the forge has them). `Task.start()` starts one; its TaskRun follows it.

import { ConnectionConfig, request } from './http.js';
import { camelize, compact, toDate } from './convert.js';
import { parseSSE, sseError } from './sse.js';
import { checkOptions } from './options.js';
import { configOf, listAll } from './resources.js';
import type {
  ConnectionOptions,
  TaskEvent,
  TaskInfo,
  TaskListOptions,
  TaskLogChunk,
  TaskStartOptions,
  TaskState,
  TaskWaitOptions,
} from './types.js';

const enc = encodeURIComponent;
type Opts = ConnectionOptions & { signal?: AbortSignal };

const START_OPTIONS = ['repository', 'task', 'baseBranch', 'forge', 'agent', 'metadata'];
const TERMINAL: ReadonlySet<string> = new Set(['stopped', 'failed', 'cancelled']);

/** Whether a run's state is final (`stopped`, `failed` or `cancelled`). */
export function isTerminal(state: TaskState | string | null | undefined): boolean {
  return state != null && TERMINAL.has(state);
}

function taskInfo(raw: unknown): TaskInfo {
  return camelize<TaskInfo>(raw);
}

/** Follows a run's `events` stream (SSE), yielding TaskEvents until the server ends it. */
async function* followEvents(config: ConnectionConfig, taskId: string, signal?: AbortSignal | null): AsyncGenerator<TaskEvent, void, undefined> {
  const res = await request(config, 'GET', `/tasks/${enc(taskId)}/events`, { signal, timeoutMs: config.requestTimeoutMs, as: 'response' });
  const requestId = res.headers.get('x-request-id');
  for await (const msg of parseSSE(res.body)) {
    if (msg.event === 'error') throw sseError(msg.data, requestId);
    let raw: unknown;
    try {
      raw = JSON.parse(msg.data);
    } catch {
      raw = { text: msg.data };
    }
    const data = camelize<Record<string, unknown>>(raw && typeof raw === 'object' ? raw : { value: raw });
    if ('at' in data) data.at = toDate(data.at);
    const ev: TaskEvent = { type: msg.event, data };
    if (msg.event === 'state' && typeof data.state === 'string') ev.state = data.state as TaskState;
    yield ev;
  }
}

/** Follows a run's `log` stream (the agent's output while it runs; never stored). */
async function* followLog(config: ConnectionConfig, taskId: string, signal?: AbortSignal | null): AsyncGenerator<TaskLogChunk, void, undefined> {
  const res = await request(config, 'GET', `/tasks/${enc(taskId)}/log`, { signal, timeoutMs: config.requestTimeoutMs, as: 'response' });
  const requestId = res.headers.get('x-request-id');
  for await (const msg of parseSSE(res.body)) {
    if (msg.event === 'error') throw sseError(msg.data, requestId);
    if (msg.event !== 'output') continue;
    let d: any;
    try {
      d = JSON.parse(msg.data);
    } catch {
      continue;
    }
    yield { stream: String(d?.stream ?? 'stdout'), text: String(d?.text ?? '') };
  }
}

/** Task runs of the workspace: start, list, get, cancel, follow. */
export class Task {
  /**
   * Starts a run: `Task.start({repository, task, baseBranch?, forge?, agent?, metadata?})`.
   * PermissionDeniedError when the workspace's `tasksEnabled` is off, InsufficientFundsError
   * when the wallet cannot cover the worst case, NotFoundError for an unknown repository or
   * base branch; nothing is queued then.
   */
  static async start(opts: TaskStartOptions): Promise<TaskRun> {
    const o = checkOptions(opts, START_OPTIONS, 'Task.start');
    const config = configOf(o);
    const r = await request(config, 'POST', '/tasks', {
      json: compact({
        repository: o.repository,
        task: o.task,
        base_branch: o.baseBranch,
        forge: o.forge,
        agent: o.agent,
        metadata: o.metadata,
      }),
      signal: o.signal,
    });
    return new TaskRun(taskInfo(r.data), config);
  }

  /** One run (NotFoundError when unknown), as a TaskRun to follow. */
  static async get(taskId: string, opts: Opts = {}): Promise<TaskRun> {
    const config = configOf(opts);
    const r = await request(config, 'GET', `/tasks/${enc(taskId)}`, { signal: opts.signal });
    return new TaskRun(taskInfo(r.data), config);
  }

  /** The workspace's runs, newest first, every page followed; filters `state`, `repository`. */
  static async list(opts: TaskListOptions = {}): Promise<TaskInfo[]> {
    const o = checkOptions(opts, ['state', 'repository', 'limit'], 'Task.list');
    const data = await listAll(configOf(o), '/tasks', { state: o.state, repository: o.repository, limit: o.limit }, o.signal);
    return data.map(taskInfo);
  }

  /** Cancels a run (its work so far is still pushed); returns it. Idempotent on an ended run. */
  static async cancel(taskId: string, opts: Opts = {}): Promise<TaskInfo> {
    const r = await request(configOf(opts), 'POST', `/tasks/${enc(taskId)}/cancel`, { signal: opts.signal });
    return taskInfo(r.data);
  }

  /**
   * A run's events as an async iterator: `state` (the first is the state it is in now) and
   * `progress`; it ends after a terminal state.
   */
  static events(taskId: string, opts: Opts = {}): AsyncGenerator<TaskEvent, void, undefined> {
    return followEvents(configOf(opts), taskId, opts.signal);
  }

  /**
   * The agent's output while the run is alive, as an async iterator of `{stream, text}`;
   * GoneError (410) once the run has ended (the output is never stored).
   */
  static log(taskId: string, opts: Opts = {}): AsyncGenerator<TaskLogChunk, void, undefined> {
    return followLog(configOf(opts), taskId, opts.signal);
  }
}

/** A task run: its state as last read, and what can be done to it. */
export class TaskRun {
  /** The connection it was read with. */
  readonly config: ConnectionConfig;
  /** The run as last read. */
  info: TaskInfo;

  /** Wraps a run as the SDK read it; prefer `Task.start()` / `Task.get()`. */
  constructor(info: { id: string } & Partial<TaskInfo>, opts?: ConnectionOptions | ConnectionConfig) {
    if (!info || typeof info.id !== 'string') throw new TypeError('a task run needs an id');
    this.config = configOf(opts);
    this.info = info as TaskInfo;
  }

  get id(): string {
    return this.info.id;
  }

  /** queued, provisioning, running, stopped, failed or cancelled (as last read). */
  get state(): TaskState {
    return this.info.state;
  }

  /** The branch the agent works on. */
  get branch(): string {
    return this.info.branch;
  }

  /** Reads the run again. */
  async refresh(opts: { signal?: AbortSignal } = {}): Promise<TaskInfo> {
    const r = await request(this.config, 'GET', `/tasks/${enc(this.id)}`, { signal: opts.signal });
    this.info = taskInfo(r.data);
    return this.info;
  }

  /** Cancels the run; returns it as the server has it now. */
  async cancel(opts: { signal?: AbortSignal } = {}): Promise<TaskInfo> {
    this.info = await Task.cancel(this.id, { ...this.config.toOptions(), signal: opts.signal });
    return this.info;
  }

  /** Its events (see `Task.events`). */
  events(opts: { signal?: AbortSignal } = {}): AsyncGenerator<TaskEvent, void, undefined> {
    return followEvents(this.config, this.id, opts.signal);
  }

  /** The agent's output while it runs (see `Task.log`). */
  log(opts: { signal?: AbortSignal } = {}): AsyncGenerator<TaskLogChunk, void, undefined> {
    return followLog(this.config, this.id, opts.signal);
  }

  /**
   * Follows the events until the run ends and returns it as it ended (`onEvent` gets every
   * event). Should the stream break off before a terminal state, it is opened again.
   */
  async wait(opts: TaskWaitOptions = {}): Promise<TaskInfo> {
    for (let attempt = 0; ; attempt++) {
      let ended = false;
      try {
        for await (const ev of this.events({ signal: opts.signal })) {
          if (opts.onEvent) await opts.onEvent(ev);
          if (ev.type === 'state' && isTerminal(ev.state)) ended = true;
        }
      } catch (e) {
        if (opts.signal?.aborted || attempt >= 3) throw e;
      }
      const info = await this.refresh({ signal: opts.signal });
      if (ended || isTerminal(info.state)) return info;
      if (attempt >= 3) return info;
    }
  }
}
