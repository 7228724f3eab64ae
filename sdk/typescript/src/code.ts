// The code interpreter: persistent Python and JavaScript contexts (`sandbox.runCode`, `sandbox.code`).
import { checkOptions } from './options.js';
import type { Sandbox } from './sandbox.js';
import type { ExecutionError, KernelInfo, Language, OutputData, RunCodeOptions } from './types.js';

/** Client-side slack over a cell's timeout before the SDK stops waiting. */
const SLACK_MS = 30_000;
const MAX_CELL_TIMEOUT_SEC = 300;

/** The outcome of one cell. */
export class Execution {
  /** False when the cell raised (see `error`). */
  readonly ok: boolean;
  readonly stdout: string;
  readonly stderr: string;
  /** The value of the cell's last expression as the language's REPL shows it, else null. */
  readonly result: string | null;
  readonly language: string;
  /** What the cell raised: `{name, value, traceback}`, else null. */
  readonly error: ExecutionError | null;
  /** Rich outputs (images, HTML, ...): `{mime, data}`, binary data in base64. */
  readonly outputs: OutputData[];
  /** The interpreter had to be restarted (every context of the language was lost). */
  readonly restarted: boolean;

  /** @internal */
  constructor(d: any) {
    this.ok = Boolean(d.ok);
    this.stdout = d.stdout ?? '';
    this.stderr = d.stderr ?? '';
    this.result = d.result ?? null;
    this.language = String(d.language ?? '');
    this.error = d.error ? { name: d.error.name, value: d.error.value, traceback: d.error.traceback } : null;
    this.outputs = Array.isArray(d.outputs) ? d.outputs.map((o: OutputData) => ({ mime: o.mime, data: o.data })) : [];
    this.restarted = Boolean(d.restarted);
  }

  /** The last expression's value (alias of `result`). */
  get text(): string | null {
    return this.result;
  }

  toJSON(): Record<string, unknown> {
    return {
      ok: this.ok,
      stdout: this.stdout,
      stderr: this.stderr,
      result: this.result,
      language: this.language,
      error: this.error,
      outputs: this.outputs,
      restarted: this.restarted,
    };
  }
}

function cellTimeoutMs(timeout: unknown): number {
  const t: number = typeof timeout === 'number' && timeout > 0 ? Math.min(timeout, MAX_CELL_TIMEOUT_SEC) : MAX_CELL_TIMEOUT_SEC;
  return t * 1000 + SLACK_MS;
}

/** The code interpreter of a sandbox: `sandbox.code`. */
export class CodeInterpreter {
  private readonly _sandbox: Sandbox;

  /** @internal */
  constructor(sandbox: Sandbox) {
    this._sandbox = sandbox;
  }

  /**
   * Runs a cell in a persistent context (`language`: `python` (default) or `javascript`;
   * `context`: default `default`; `timeout`: seconds, capped at 300).
   */
  async run(code: string, opts: RunCodeOptions = {}): Promise<Execution> {
    opts = checkOptions(opts, ['language', 'context', 'timeout', 'timeoutSec'], 'code.run');
    if (opts.timeoutSec !== undefined) {
      if (opts.timeout !== undefined) throw new TypeError('code.run: give timeout or timeoutSec, not both');
      opts.timeout = opts.timeoutSec;
    }
    const body: Record<string, unknown> = { code };
    if (opts.language !== undefined) body.language = opts.language;
    if (opts.context !== undefined) body.context = opts.context;
    if (opts.timeout !== undefined) body.timeout = opts.timeout;
    const r = await this._sandbox._request('POST', '/code/run', {
      json: body,
      signal: opts.signal,
      timeoutMs: opts.requestTimeoutMs ?? cellTimeoutMs(opts.timeout),
    });
    return new Execution(r.data);
  }

  /** Which kernels run, their contexts, busy or idle. Never starts a kernel. */
  async state(): Promise<{ kernels: KernelInfo[] }> {
    const r = await this._sandbox._request('GET', '/code');
    return r.data;
  }

  /** The contexts of a language (default python): `[{name, language}]`. */
  async contexts(opts: { language?: Language } = {}): Promise<Array<{ name: string; language: string }>> {
    const r = await this._sandbox._request('GET', '/code/contexts', { query: { language: opts.language } });
    return r.data;
  }

  /** Makes a context (or finds it): `{name, language, created}`. */
  async createContext(opts: { language?: Language; context?: string } = {}): Promise<{ name: string; language: string; created: boolean }> {
    const body: Record<string, unknown> = {};
    if (opts.language !== undefined) body.language = opts.language;
    if (opts.context !== undefined) body.context = opts.context;
    const r = await this._sandbox._request('POST', '/code/contexts', { json: body });
    return { name: r.data.name, language: r.data.language, created: Boolean(r.data.changed) };
  }

  /** Forgets a context's variables, imports and definitions: `{name, language, existed}`. */
  async resetContext(context: string, opts: { language?: Language } = {}): Promise<{ name: string; language: string; existed: boolean }> {
    const r = await this._sandbox._request('DELETE', `/code/contexts/${encodeURIComponent(context)}`, {
      query: { language: opts.language },
    });
    return { name: r.data.name, language: r.data.language, existed: Boolean(r.data.changed) };
  }

  /** Ends a language's kernel (every context of it); it starts afresh on the next cell. */
  async reset(opts: { language?: Language } = {}): Promise<{ kernels: KernelInfo[] }> {
    const r = await this._sandbox._request('DELETE', '/code', { query: { language: opts.language } });
    return r.data;
  }
}
