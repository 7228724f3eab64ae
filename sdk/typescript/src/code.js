// The code interpreter: persistent Python and JavaScript contexts (`sandbox.runCode`, `sandbox.code`).
import { checkOptions } from './options.js';

/** Client-side slack over a cell's timeout before the SDK stops waiting. */
const SLACK_MS = 30_000;
const MAX_CELL_TIMEOUT_SEC = 300;

/** The outcome of one cell. */
export class Execution {
  constructor(d) {
    /** False when the cell raised (see `error`). */
    this.ok = Boolean(d.ok);
    this.stdout = d.stdout ?? '';
    this.stderr = d.stderr ?? '';
    /** The value of the cell's last expression as the language's REPL shows it, else null. */
    this.result = d.result ?? null;
    this.language = d.language ?? null;
    /** What the cell raised: `{name, value, traceback}`, else null. */
    this.error = d.error ? { name: d.error.name, value: d.error.value, traceback: d.error.traceback } : null;
    /** Rich outputs (images, HTML, ...): `{mime, data}`, binary data in base64. */
    this.outputs = Array.isArray(d.outputs) ? d.outputs.map((o) => ({ mime: o.mime, data: o.data })) : [];
    /** The interpreter had to be restarted (every context of the language was lost). */
    this.restarted = Boolean(d.restarted);
  }

  /** The last expression's value (alias of `result`). */
  get text() {
    return this.result;
  }

  toJSON() {
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

function cellTimeoutMs(timeout) {
  const t = typeof timeout === 'number' && timeout > 0 ? Math.min(timeout, MAX_CELL_TIMEOUT_SEC) : MAX_CELL_TIMEOUT_SEC;
  return t * 1000 + SLACK_MS;
}

/** The code interpreter of a sandbox: `sandbox.code`. */
export class CodeInterpreter {
  /** @param {import('./sandbox.js').Sandbox} sandbox */
  constructor(sandbox) {
    this._sandbox = sandbox;
  }

  /**
   * Runs a cell in a persistent context (`language`: `python` (default) or `javascript`;
   * `context`: default `default`; `timeout`: seconds, capped at 300).
   * @returns {Promise<Execution>}
   */
  async run(code, opts = {}) {
    opts = checkOptions(opts, ['language', 'context', 'timeout', 'timeoutSec'], 'code.run');
    if (opts.timeoutSec !== undefined) {
      if (opts.timeout !== undefined) throw new TypeError('code.run: give timeout or timeoutSec, not both');
      opts.timeout = opts.timeoutSec;
    }
    const body = { code };
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
  async state() {
    const r = await this._sandbox._request('GET', '/code');
    return r.data;
  }

  /** The contexts of a language (default python): `[{name, language}]`. */
  async contexts(opts = {}) {
    const r = await this._sandbox._request('GET', '/code/contexts', { query: { language: opts.language } });
    return r.data;
  }

  /** Makes a context (or finds it): `{name, language, created}`. */
  async createContext(opts = {}) {
    const body = {};
    if (opts.language !== undefined) body.language = opts.language;
    if (opts.context !== undefined) body.context = opts.context;
    const r = await this._sandbox._request('POST', '/code/contexts', { json: body });
    return { name: r.data.name, language: r.data.language, created: Boolean(r.data.changed) };
  }

  /** Forgets a context's variables, imports and definitions: `{name, language, existed}`. */
  async resetContext(context, opts = {}) {
    const r = await this._sandbox._request('DELETE', `/code/contexts/${encodeURIComponent(context)}`, {
      query: { language: opts.language },
    });
    return { name: r.data.name, language: r.data.language, existed: Boolean(r.data.changed) };
  }

  /** Ends a language's kernel (every context of it); it starts afresh on the next cell. */
  async reset(opts = {}) {
    const r = await this._sandbox._request('DELETE', '/code', { query: { language: opts.language } });
    return r.data;
  }
}
