// Errors and the transport: 429 retries after Retry-After against a real server with tight
// limits, the plan cap, request ids, and responses that are not envelopes (a stand-in server).

import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { createServer } from 'node:http';
import {
  Sandbox,
  CellaError,
  RateLimitedError,
  ConcurrencyLimitError,
  NotFoundError,
  InternalServerError,
  UnavailableError,
  TimeoutError,
  ConnectionConfig,
  DEFAULT_SERVER,
} from '@cella/sdk';
import { adminCall, startServer } from './server.js';

let srv;

before(async () => {
  // One read request per second: the second of two quick reads is refused with a 429.
  srv = await startServer({ config: '[rate_limits]\nread = { per_second = 1.0, burst = 1 }\n' });
});

after(async () => {
  await srv?.stop();
});

describe('rate limits', () => {
  it('retries a 429 after Retry-After and succeeds', async () => {
    await Sandbox.list(srv.opts).catch(() => {});
    const started = Date.now();
    await Sandbox.list(srv.opts);
    await Sandbox.list(srv.opts);
    assert.ok(Date.now() - started >= 900, `two reads took only ${Date.now() - started} ms`);
  });

  it('throws RateLimitedError once the retries run out', async () => {
    await Sandbox.list(srv.opts).catch(() => {});
    await assert.rejects(Sandbox.list({ ...srv.opts, maxRetries: 0 }), (e) => {
      assert.ok(e instanceof RateLimitedError);
      assert.equal(e.code, 'RATE_LIMITED');
      assert.equal(e.status, 429);
      assert.ok(e.retryAfter >= 1);
      assert.equal(e.details.group, 'read');
      assert.ok(e.requestId);
      return true;
    });
  });

  it('a workspace at its plan cap gets ConcurrencyLimitError', async () => {
    const ws = await adminCall(srv, 'POST', '/workspaces', { name: 'capped', plan: 'developer' });
    const key = await adminCall(srv, 'POST', '/api-keys', {
      workspace_id: ws.id,
      name: 'capped',
      scopes: ['sandboxes:read', 'sandboxes:write'],
    });
    const opts = { server: srv.url, apiKey: key.key };
    const made = [];
    try {
      for (let i = 0; i < 10; i++) made.push(await Sandbox.create({ ...opts, size: 'xs' }));
      await assert.rejects(Sandbox.create({ ...opts, size: 'xs', maxRetries: 0 }), (e) => {
        assert.ok(e instanceof ConcurrencyLimitError);
        assert.ok(e instanceof RateLimitedError);
        assert.equal(e.code, 'CONCURRENCY_LIMIT');
        assert.equal(e.details.limit, 10);
        assert.equal(e.retryAfter, 5);
        return true;
      });
    } finally {
      for (const sb of made) await sb.kill();
    }
  });

  it('echoes a caller-chosen x-request-id in errors', async () => {
    await assert.rejects(
      Sandbox.connect('sbnosuchsandbox00000', { ...srv.opts, headers: { 'x-request-id': 'my-trace-1' } }),
      (e) => e instanceof NotFoundError && e.requestId === 'my-trace-1',
    );
  });
});

describe('transport against a stand-in server', () => {
  let fake;
  let url;
  let hits = 0;
  before(async () => {
    fake = createServer((req, res) => {
      hits++;
      if (req.url.startsWith('/api/v1/sandboxes/sbretry')) {
        if (hits % 2 === 1) {
          res.writeHead(429, { 'retry-after': new Date(Date.now() + 1000).toUTCString(), 'x-request-id': 'r1' });
          return res.end('slow down');
        }
        res.writeHead(200, { 'content-type': 'application/json' });
        return res.end(JSON.stringify({ data: { id: 'sbretry', state: 'running', created_at: '2026-01-01T00:00:00.000Z' } }));
      }
      if (req.url.startsWith('/api/v1/sandboxes/sbbadgateway')) {
        res.writeHead(502, { 'x-request-id': 'r2' });
        return res.end('<html>bad gateway</html>');
      }
      if (req.url.startsWith('/api/v1/sandboxes/sbnewcode')) {
        res.writeHead(503, { 'content-type': 'application/json' });
        return res.end(JSON.stringify({ error: { code: 'SOMETHING_NEW', message: 'new', details: { x: 1 } } }));
      }
      if (req.url.startsWith('/api/v1/sandboxes/sbinternal')) {
        res.writeHead(500, { 'content-type': 'application/json', 'x-request-id': 'r3' });
        return res.end(JSON.stringify({ error: { code: 'INTERNAL', message: 'internal error', details: null } }));
      }
      // Never answers.
    });
    await new Promise((r) => fake.listen(0, '127.0.0.1', r));
    url = `http://127.0.0.1:${fake.address().port}`;
  });
  after(() => {
    fake.closeAllConnections();
    fake.close();
  });

  it('honours Retry-After given as an HTTP date, and converts times to Dates', async () => {
    const sb = await Sandbox.connect('sbretry', { server: url, apiKey: 'k' });
    assert.equal(sb.state, 'running');
    assert.ok(sb.info.createdAt instanceof Date);
  });

  it('turns bodies that are not envelopes, and unknown codes, into typed errors', async () => {
    await assert.rejects(Sandbox.connect('sbbadgateway', { server: url, apiKey: 'k' }), (e) => {
      assert.equal(e.constructor, CellaError);
      assert.equal(e.status, 502);
      assert.equal(e.code, 'HTTP_502');
      assert.match(e.message, /bad gateway/);
      assert.equal(e.requestId, 'r2');
      return true;
    });
    await assert.rejects(Sandbox.connect('sbnewcode', { server: url, apiKey: 'k' }), (e) => {
      assert.ok(e instanceof UnavailableError);
      assert.equal(e.code, 'SOMETHING_NEW');
      assert.deepEqual(e.details, { x: 1 });
      return true;
    });
    await assert.rejects(Sandbox.connect('sbinternal', { server: url, apiKey: 'k' }), (e) => e instanceof InternalServerError && e.requestId === 'r3');
  });

  it('gives up after requestTimeoutMs with TimeoutError', async () => {
    await assert.rejects(Sandbox.connect('sbsilent', { server: url, apiKey: 'k', requestTimeoutMs: 300 }), (e) => {
      assert.ok(e instanceof TimeoutError);
      assert.equal(e.code, 'TIMEOUT');
      return true;
    });
  });
});

describe('configuration', () => {
  it('defaults and normalises the server URL', () => {
    const saved = [process.env.CELLA_SERVER, process.env.CELLA_API_KEY];
    delete process.env.CELLA_SERVER;
    delete process.env.CELLA_API_KEY;
    try {
      const c = new ConnectionConfig();
      assert.equal(c.server, DEFAULT_SERVER);
      assert.equal(DEFAULT_SERVER, 'http://127.0.0.1:7070');
      assert.equal(c.apiKey, null);
      assert.equal(c.maxRetries, 3);
      assert.equal(new ConnectionConfig({ server: 'http://h:1/api/v1/' }).server, 'http://h:1');
      assert.equal(new ConnectionConfig({ server: 'h:2' }).server, 'http://h:2');
      process.env.CELLA_SERVER = 'http://from-env:3';
      process.env.CELLA_API_KEY = 'envkey';
      const e = new ConnectionConfig();
      assert.equal(e.server, 'http://from-env:3');
      assert.equal(e.apiKey, 'envkey');
      assert.equal(new ConnectionConfig({ apiKey: 'given' }).apiKey, 'given');
    } finally {
      for (const [k, v] of [['CELLA_SERVER', saved[0]], ['CELLA_API_KEY', saved[1]]]) {
        if (v === undefined) delete process.env[k];
        else process.env[k] = v;
      }
    }
  });
});
