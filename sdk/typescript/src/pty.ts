// The terminal: a program on a pseudo-terminal in the sandbox, over a WebSocket
// (`GET /api/v1/sandboxes/{id}/pty`). Needs a WebSocket class that sends headers (Node 22's
// global one, Node 20's with `--experimental-websocket`, or one passed as `webSocket`).

import { ConnectionError, SandboxNotRunningError } from './errors.js';
import { checkOptions } from './options.js';
import type { Sandbox } from './sandbox.js';
import type { PtyOptions, WebSocketClass } from './types.js';

const OPTIONS = ['cols', 'rows', 'command', 'user', 'cwd', 'onData', 'webSocket'];

/** `sandbox.pty`: opens terminals. */
export class Pty {
  private readonly _sandbox: Sandbox;

  /** @internal */
  constructor(sandbox: Sandbox) {
    this._sandbox = sandbox;
  }

  /**
   * Opens a terminal running a login shell (or `command`) and resolves once it is open. Type
   * with `sendInput()`, read the output by iterating the handle or with `onData`; `wait()`
   * gives the exit code, `kill()` hangs it up.
   */
  async create(opts: PtyOptions = {}): Promise<PtyHandle> {
    const o = checkOptions(opts, OPTIONS, 'pty.create');
    const WS: WebSocketClass | undefined = o.webSocket ?? (globalThis as { WebSocket?: WebSocketClass }).WebSocket;
    if (!WS) {
      throw new TypeError(
        'pty.create: this runtime has no WebSocket class: use Node 22, Node 20 with --experimental-websocket, or pass webSocket',
      );
    }
    const config = this._sandbox.config;
    const q = new URLSearchParams();
    for (const k of ['cols', 'rows', 'command', 'user', 'cwd'] as const) if (o[k] !== undefined) q.set(k, String(o[k]));
    const qs = q.toString();
    const url = `${config.server.replace(/^http/i, 'ws')}/api/v1/sandboxes/${encodeURIComponent(this._sandbox.id)}/pty${qs ? `?${qs}` : ''}`;
    const headers: Record<string, string> = { ...config.headers };
    if (config.apiKey) headers.authorization = `Bearer ${config.apiKey}`;
    const ws = new WS(url, { headers });
    ws.binaryType = 'arraybuffer';
    const handle = new PtyHandle(ws, o.onData);
    try {
      await handle._opened;
    } catch (e) {
      // The WebSocket API hides the refusal's status: ask the sandbox what is wrong with it.
      const info = await this._sandbox.refresh();
      if (info.state !== 'running') {
        throw new SandboxNotRunningError(`sandbox ${info.id} is ${info.state}`, { code: 'SANDBOX_NOT_RUNNING', status: 409, details: { state: info.state } });
      }
      throw e;
    }
    return handle;
  }
}

/** An open terminal. Async-iterate it for its output (raw bytes) until the program exits. */
export class PtyHandle implements AsyncIterable<Uint8Array> {
  /** The program's exit code once it exited (null if the socket closed without one). */
  exitCode: number | null = null;
  /** @internal */
  readonly _opened: Promise<void>;
  private readonly _ws: WebSocket;
  private readonly _closed: Promise<number | null>;
  private readonly _queue: Uint8Array[] = [];
  private _wake: (() => void) | null = null;
  private _ended = false;

  /** @internal */
  constructor(ws: WebSocket, onData?: PtyOptions['onData']) {
    this._ws = ws;
    this._opened = new Promise((resolve, reject) => {
      ws.addEventListener('open', () => resolve(), { once: true });
      ws.addEventListener(
        'error',
        (ev) => reject(new ConnectionError(`the terminal did not open: ${(ev as { message?: string }).message ?? 'refused'}`, { code: 'CONNECTION' })),
        { once: true },
      );
    });
    this._opened.catch(() => {});
    ws.addEventListener('message', (ev: MessageEvent) => {
      if (typeof ev.data === 'string') {
        try {
          const msg = JSON.parse(ev.data);
          if (msg && typeof msg.exit === 'object') this.exitCode = msg.exit.exit_code ?? null;
        } catch {
          // not a control frame
        }
        return;
      }
      const bytes = new Uint8Array(ev.data as ArrayBuffer);
      if (onData) void Promise.resolve(onData(bytes)).catch(() => {});
      this._queue.push(bytes);
      this._wake?.();
    });
    this._closed = new Promise((resolve) => {
      ws.addEventListener('close', () => {
        this._ended = true;
        this._wake?.();
        resolve(this.exitCode);
      });
    });
  }

  /** Types into the terminal (text as UTF-8, or raw bytes). */
  sendInput(data: string | Uint8Array): void {
    this._ws.send(typeof data === 'string' ? new TextEncoder().encode(data) : data);
  }

  /** Resizes the terminal. */
  resize(size: { cols: number; rows: number }): void {
    this._ws.send(JSON.stringify({ resize: size }));
  }

  /** Waits until the program exits (and the server closes the socket); returns the exit code. */
  async wait(): Promise<number | null> {
    return this._closed;
  }

  /** Hangs the terminal up: the program gets SIGHUP, then its tree is killed. */
  async kill(): Promise<void> {
    if (this._ws.readyState === this._ws.OPEN || this._ws.readyState === this._ws.CONNECTING) this._ws.close();
    await this._closed;
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<Uint8Array, void, undefined> {
    for (;;) {
      const next = this._queue.shift();
      if (next) {
        yield next;
        continue;
      }
      if (this._ended) return;
      await new Promise<void>((resolve) => {
        this._wake = resolve;
      });
      this._wake = null;
    }
  }
}
