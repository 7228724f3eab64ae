// Commands: run to the end (exec, streamed exec) or start in the background (processes).

import { ConflictError } from './errors.js';
import { compact, camelize } from './convert.js';
import { outputEvents } from './sse.js';
import { checkOptions } from './options.js';
import type { ExitData } from './sse.js';
import type { Sandbox } from './sandbox.js';
import type { CommandOptions, CommandResult, OutputChunk, ProcessInfo, RunOptions, Signal, StartOptions } from './types.js';

type Callbacks = Pick<CommandOptions, 'onStdout' | 'onStderr' | 'signal'>;

const RUN_OPTIONS = ['env', 'cwd', 'user', 'stdin', 'timeoutSec', 'background', 'onStdout', 'onStderr', 'tag'];
// stdin and timeoutSec are not fields of the processes route: passed on so the server says so (400).
const START_OPTIONS = ['env', 'cwd', 'user', 'tag', 'onStdout', 'onStderr', 'background', 'stdin', 'timeoutSec'];

/** Client-side slack over a command's own timeout before the SDK stops waiting. */
const SLACK_MS = 30_000;
const DEFAULT_EXEC_TIMEOUT_SEC = 3600;

function commandFields(cmd: string | string[]): { argv: string[] } | { command: string } {
  if (Array.isArray(cmd)) return { argv: cmd.map(String) };
  if (typeof cmd === 'string') return { command: cmd };
  throw new TypeError('a command is a shell line (string) or an argv array');
}

function execBody(cmd: string | string[], opts: Record<string, any>) {
  return compact({
    ...commandFields(cmd),
    env: opts.env,
    cwd: opts.cwd,
    user: opts.user,
    stdin: opts.stdin,
    timeout_sec: opts.timeoutSec,
  });
}

function commandResult(d: Partial<ExitData> & Record<string, any>): CommandResult {
  const extra = {};
  return {
    exitCode: d.exit_code as number,
    stdout: d.stdout ?? '',
    stderr: d.stderr ?? '',
    durationMs: d.duration_ms ?? 0,
    timedOut: Boolean(d.timed_out),
    stdoutTruncated: Boolean(d.stdout_truncated),
    stderrTruncated: Boolean(d.stderr_truncated),
    ...extra,
  };
}

function processInfo(raw: unknown): ProcessInfo {
  return camelize<ProcessInfo>(raw);
}

/** Reads an output stream to its exit, calling the callbacks, and returns a CommandResult. */
async function collect(res: Response, { onStdout, onStderr }: Callbacks = {}): Promise<CommandResult> {
  let stdout = '';
  let stderr = '';
  const events = outputEvents(res);
  try {
    for (;;) {
      const { value, done } = await events.next();
      if (done) {
        return commandResult({ ...value, stdout, stderr });
      }
      if (value.type === 'stdout') {
        stdout += value.data;
        if (onStdout) await onStdout(value.data);
      } else {
        stderr += value.data;
        if (onStderr) await onStderr(value.data);
      }
    }
  } finally {
    // A callback that threw leaves the stream open: close it (for a streamed exec, the server
    // then ends the command).
    await events.return(undefined as unknown as ExitData);
  }
}

/** Commands run in a sandbox: `sandbox.commands`. */
export class Commands {
  private readonly _sandbox: Sandbox;

  /** @internal */
  constructor(sandbox: Sandbox) {
    this._sandbox = sandbox;
  }

  /**
   * Runs a command to its end. With `onStdout`/`onStderr` the output is streamed to them as it
   * comes (`POST .../exec/stream`); without, one request answers it all (`POST .../exec`).
   * With `background: true` it starts the command and returns its CommandHandle (see start()).
   * A non-zero exit code is not an error: read `exitCode`.
   */
  async run(cmd: string | string[], opts: RunOptions & { background: true }): Promise<CommandHandle>;
  async run(cmd: string | string[], opts?: RunOptions): Promise<CommandResult>;
  async run(cmd: string | string[], opts: RunOptions = {}): Promise<CommandResult | CommandHandle> {
    opts = checkOptions(opts, RUN_OPTIONS, 'commands.run');
    if (opts.background) return this.start(cmd, opts as StartOptions);
    const body = execBody(cmd, opts);
    const timeoutMs =
      opts.requestTimeoutMs !== undefined
        ? opts.requestTimeoutMs
        : ((opts.timeoutSec as number | undefined) ?? DEFAULT_EXEC_TIMEOUT_SEC) * 1000 + SLACK_MS;
    if (!opts.onStdout && !opts.onStderr) {
      const r = await this._sandbox._request('POST', '/exec', { json: body, signal: opts.signal, timeoutMs });
      return commandResult(r.data);
    }
    const res = await this._sandbox._request('POST', '/exec/stream', {
      json: body,
      signal: opts.signal,
      timeoutMs,
      as: 'response',
    });
    return collect(res, opts);
  }

  /**
   * Starts a command in the background (`POST .../processes`) and returns its handle at once.
   * `onStdout`/`onStderr` follow its output from the start.
   */
  async start(cmd: string | string[], opts: StartOptions = {}): Promise<CommandHandle> {
    opts = checkOptions(opts, START_OPTIONS, 'commands.start');
    const body = compact({
      ...commandFields(cmd),
      env: opts.env,
      cwd: opts.cwd,
      user: opts.user,
      tag: opts.tag,
      stdin: (opts as Record<string, any>).stdin,
      timeout_sec: (opts as Record<string, any>).timeoutSec,
    });
    const r = await this._sandbox._request('POST', '/processes', { json: body, signal: opts.signal });
    const handle = new CommandHandle(this._sandbox, processInfo(r.data));
    if (opts.onStdout || opts.onStderr) handle._follow(opts);
    return handle;
  }

  /** Attaches to a background process by pid. */
  async connect(pid: number, opts: Callbacks = {}): Promise<CommandHandle> {
    const r = await this._sandbox._request('GET', `/processes/${encodeURIComponent(pid)}`);
    const handle = new CommandHandle(this._sandbox, processInfo(r.data));
    if (opts.onStdout || opts.onStderr) handle._follow(opts);
    return handle;
  }

  /** The background processes: those running and the last 64 that exited. */
  async list(): Promise<ProcessInfo[]> {
    const r = await this._sandbox._request('GET', '/processes');
    return r.data.map(processInfo);
  }

  /**
   * Sends a signal (default `SIGKILL`) to a background process. Returns false if it had
   * already exited.
   */
  async kill(pid: number, signal: Signal = 'SIGKILL'): Promise<boolean> {
    try {
      await this._sandbox._request('POST', `/processes/${encodeURIComponent(pid)}/signal`, { json: { signal } });
      return true;
    } catch (e) {
      if (e instanceof ConflictError) return false;
      throw e;
    }
  }

  /** Writes to a background process's standard input; `close: true` closes it afterwards. */
  async sendStdin(pid: number, data: string | Uint8Array | ArrayBuffer | Blob, opts: { close?: boolean } = {}): Promise<ProcessInfo> {
    const r = await this._sandbox._request('POST', `/processes/${encodeURIComponent(pid)}/stdin`, {
      body: (typeof data === 'string' ? new TextEncoder().encode(data) : data) as BodyInit,
      headers: { 'content-type': 'application/octet-stream' },
      query: opts.close ? { close: 'true' } : undefined,
    });
    return processInfo(r.data);
  }
}

/** A background process. Async-iterate it for its output (from the start). */
export class CommandHandle implements AsyncIterable<OutputChunk> {
  private readonly _sandbox: Sandbox;
  /** The process as last read. */
  info: ProcessInfo;
  private _result: CommandResult | null = null;
  private _following: Promise<CommandResult> | null = null;

  /** Wraps a process by pid without a request; prefer `commands.start()` / `commands.connect()`. */
  constructor(sandbox: Sandbox, info: { pid: number } & Partial<ProcessInfo>) {
    this._sandbox = sandbox;
    this.info = info as ProcessInfo;
  }

  /** Its pid inside the sandbox. */
  get pid(): number {
    return this.info.pid;
  }

  get tag(): string | null {
    return this.info.tag ?? null;
  }

  /** Its exit code once it is known to have exited, else null. */
  get exitCode(): number | null {
    return this._result?.exitCode ?? this.info.exitCode ?? null;
  }

  private _path(suffix = ''): string {
    return `/processes/${encodeURIComponent(this.pid)}${suffix}`;
  }

  /** Reads the process again (state, exit code). */
  async refresh(): Promise<ProcessInfo> {
    const r = await this._sandbox._request('GET', this._path());
    this.info = processInfo(r.data);
    return this.info;
  }

  private async _open(from: string, signal?: AbortSignal | null): Promise<Response> {
    return this._sandbox._request('GET', this._path('/output'), {
      query: { from },
      signal,
      as: 'response',
    });
  }

  /** @internal */
  _follow(opts: Callbacks): void {
    const run = async () => {
      const res = await this._open('start', opts.signal);
      const result = await collect(res, opts);
      this._result = result;
      return result;
    };
    this._following = run();
    // Failures surface from wait(); none goes unhandled meanwhile.
    this._following.catch(() => {});
  }

  /**
   * Follows the output (`GET .../processes/{pid}/output`, SSE) and yields
   * `{type: 'stdout'|'stderr', data, bytes}` until the process exits; then `exitCode` is set.
   * `from: 'now'` skips what was written before.
   */
  async *output(opts: { from?: 'start' | 'now'; signal?: AbortSignal } = {}): AsyncGenerator<OutputChunk, void, undefined> {
    const res = await this._open(opts.from ?? 'start', opts.signal);
    const events = outputEvents(res);
    try {
      for (;;) {
        const { value, done } = await events.next();
        if (done) {
          this._result = commandResult({ ...value, stdout: undefined, stderr: undefined });
          return;
        }
        yield value;
      }
    } finally {
      await events.return(undefined as unknown as ExitData);
    }
  }

  [Symbol.asyncIterator](): AsyncIterator<OutputChunk> {
    return this.output()[Symbol.asyncIterator]();
  }

  /**
   * Waits for the process to exit and returns its CommandResult, with the output its buffer
   * still holds (the last 1 MiB). Callbacks given here (or at start) get the output as it comes.
   */
  async wait(opts: Callbacks = {}): Promise<CommandResult> {
    if (this._following) return this._following;
    const res = await this._open('start', opts.signal);
    const result = await collect(res, opts);
    this._result = result;
    return result;
  }

  /** Sends a signal (default `SIGKILL`). Returns false if the process had already exited. */
  async kill(signal: Signal = 'SIGKILL'): Promise<boolean> {
    return this._sandbox.commands.kill(this.pid, signal);
  }

  /** Writes to its standard input; `close: true` closes it afterwards. */
  async sendStdin(data: string | Uint8Array | ArrayBuffer | Blob, opts: { close?: boolean } = {}): Promise<ProcessInfo> {
    this.info = await this._sandbox.commands.sendStdin(this.pid, data, opts);
    return this.info;
  }

  /** Closes its standard input (a program reading to the end then sees it). */
  async closeStdin(): Promise<ProcessInfo> {
    return this.sendStdin(new Uint8Array(0), { close: true });
  }
}
