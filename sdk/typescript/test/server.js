// Starts a real Cella server for a test file: CELLA_BIN (CI's fresh build) or target/debug/cella,
// a free port, a temporary data directory, a random bootstrap key. stop() destroys every
// sandbox still alive, stops the server (SIGTERM) and removes the data directory.

import { spawn, spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { closeSync, existsSync, mkdtempSync, openSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

const CLEANUP = fileURLToPath(new URL('./cleanup.js', import.meta.url));

// Default: the workspace's debug build.
export const CELLA_BIN =
  process.env.CELLA_BIN || fileURLToPath(new URL('../../../target/debug/cella', import.meta.url));
const NO_POOL = '[pool]\ndefault = 0\nsizes = {}\n\n';

function freePort() {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.unref();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/**
 * @param {{config?: string}} [opts]  TOML text of the server's configuration
 * @returns {Promise<{url: string, key: string, opts: {server: string, apiKey: string}, dir: string, log: () => string, stop: () => Promise<void>}>}
 */
export async function startServer(opts = {}) {
  if (!existsSync(CELLA_BIN)) {
    throw new Error(`no cella binary at ${CELLA_BIN}: set CELLA_BIN`);
  }
  const dir = mkdtempSync(join(tmpdir(), 'cella-sdk-ts-'));
  const cfg = join(dir, 'config.toml');
  // No warm pool: its sandboxes belong to no workspace, so the API could not destroy them
  // before the server stops. A server that does not know `[pool]` refuses it: then none.
  let withPool = !/^\s*\[pool\]/m.test(opts.config ?? '');
  const writeConfig = () => writeFileSync(cfg, (withPool ? NO_POOL : '') + (opts.config ?? ''));
  writeConfig();
  const logPath = join(dir, 'server.log');
  const key = `test_${randomBytes(16).toString('hex')}`;
  let child;
  let url;
  for (let attempt = 0; ; attempt++) {
    const port = await freePort();
    url = `http://127.0.0.1:${port}`;
    const fd = openSync(logPath, 'a');
    child = spawn(CELLA_BIN, ['serve', '--listen', `127.0.0.1:${port}`, '--data-dir', join(dir, 'data'), '--config', cfg], {
      env: { ...process.env, CELLA_BOOTSTRAP_KEY: key },
      stdio: ['ignore', fd, fd],
    });
    closeSync(fd);
    let exited = false;
    child.on('exit', () => {
      exited = true;
    });
    const deadline = Date.now() + 60_000;
    let up = false;
    while (!exited && Date.now() < deadline) {
      try {
        const r = await fetch(`${url}/healthz`);
        if (r.ok) {
          up = true;
          break;
        }
      } catch {
        // not listening yet
      }
      await sleep(50);
    }
    if (up) break;
    if (!exited) child.kill('SIGKILL');
    const log = readFileSync(logPath, 'utf8');
    // Someone took the port between the probe and the bind: try another one.
    if (attempt < 3 && /Address already in use/.test(log)) continue;
    if (attempt < 3 && withPool && /unknown field `pool`/.test(log)) {
      withPool = false;
      writeConfig();
      continue;
    }
    rmSync(dir, { recursive: true, force: true });
    throw new Error(`the cella server did not start:\n${log.slice(-4000)}`);
  }
  // Should this process die before stop() (an uncaught error, SIGINT, SIGTERM), a synchronous
  // helper still destroys the sandboxes, stops the server and removes its directory.
  const killOnExit = () => {
    spawnSync(process.execPath, [CLEANUP, url, key, String(child.pid), dir], { stdio: 'ignore', timeout: 60_000 });
  };
  process.on('exit', killOnExit);
  for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP']) {
    if (process.listenerCount(sig) === 0) process.once(sig, () => process.exit(128 + (sig === 'SIGINT' ? 2 : sig === 'SIGTERM' ? 15 : 1)));
  }

  const auth = { authorization: `Bearer ${key}` };
  async function destroyAll() {
    // Sandboxes outlive their server: every one still alive is destroyed before it stops.
    let cursor = null;
    const ids = [];
    for (;;) {
      const q = new URLSearchParams({ limit: '1000' });
      if (cursor) q.set('cursor', cursor);
      const r = await fetch(`${url}/api/v1/sandboxes?${q}`, { headers: auth });
      if (!r.ok) break;
      const body = await r.json();
      for (const sb of body.data) if (sb.state !== 'destroyed') ids.push(sb.id);
      if (!body.next_cursor || body.data.length === 0) break;
      cursor = body.next_cursor;
    }
    for (const id of ids) {
      for (let i = 0; i < 5; i++) {
        const r = await fetch(`${url}/api/v1/sandboxes/${id}`, { method: 'DELETE', headers: auth });
        await r.arrayBuffer();
        if (r.status !== 429) break;
        await sleep(1000);
      }
    }
    return ids.length;
  }

  async function stop() {
    try {
      await destroyAll();
    } finally {
      if (child.exitCode === null && child.signalCode === null) {
        const gone = new Promise((r) => child.once('exit', r));
        child.kill('SIGTERM');
        const timer = setTimeout(() => child.kill('SIGKILL'), 10_000);
        await gone;
        clearTimeout(timer);
      }
      process.off('exit', killOnExit);
      rmSync(dir, { recursive: true, force: true });
    }
  }

  return {
    url,
    key,
    dir,
    opts: { server: url, apiKey: key },
    log: () => readFileSync(logPath, 'utf8'),
    destroyAll,
    stop,
  };
}

/** Raw API call with the admin key (for setup the SDK does not cover, e.g. API keys). */
export async function adminCall(srv, method, path, body) {
  const r = await fetch(`${srv.url}/api/v1${path}`, {
    method,
    headers: { authorization: `Bearer ${srv.key}`, 'content-type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await r.text();
  if (!r.ok) throw new Error(`${method} ${path}: ${r.status} ${text}`);
  return JSON.parse(text).data;
}

/**
 * True when the server answered that the route itself does not exist: a 404 for a sandbox
 * that the server still shows as running.
 */
export async function routeMissing(err, sandbox) {
  if (err?.status !== 404 || err?.code !== 'NOT_FOUND') return false;
  try {
    const info = await sandbox.refresh();
    return info.state !== 'destroyed';
  } catch {
    return false;
  }
}

export const sleepMs = sleep;
