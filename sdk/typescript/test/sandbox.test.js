// Sandbox lifecycle against a real server: create, connect, list, refresh, pause, resume, stop,
// setTimeout, usage, kill, fork, expose, asyncDispose; configuration; an error path for each.

import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import {
  Sandbox,
  CellaError,
  NotFoundError,
  InvalidRequestError,
  ConflictError,
  AuthenticationError,
  PermissionDeniedError,
  SandboxNotRunningError,
  ConnectionError,
} from '@cella/sdk';
import { adminCall, routeMissing, startServer } from './server.js';

let srv;
let opts;

before(async () => {
  srv = await startServer();
  opts = srv.opts;
});

after(async () => {
  await srv?.stop();
});

/** Creates an xs sandbox for one test. */
const make = (extra = {}) => Sandbox.create({ ...opts, size: 'xs', ...extra });

describe('Sandbox.create', () => {
  it('creates a running sandbox with the options given', async () => {
    const sb = await Sandbox.create({
      ...opts,
      template: 'base',
      size: 'xs',
      timeoutSec: 600,
      metadata: { team: 'sdk', run: 'create' },
      env: { GREETING: 'hello' },
      network: { egress: 'deny' },
    });
    try {
      assert.match(sb.id, /^sb[a-z0-9]+$/);
      assert.equal(sb.sandboxId, sb.id);
      assert.equal(sb.state, 'running');
      assert.equal(sb.info.ready, true);
      assert.equal(sb.info.size, 'xs');
      assert.equal(sb.info.templateId, 'base');
      assert.equal(sb.info.timeoutSec, 600);
      assert.equal(sb.info.cpuCount, 1);
      assert.equal(sb.info.resourceContract.memoryMb, 1024);
      assert.deepEqual(sb.info.metadata, { team: 'sdk', run: 'create' });
      assert.equal(sb.info.network.egress, 'deny');
      assert.ok(sb.info.createdAt instanceof Date);
      // Money stays an exact decimal string (the test workspace's rate is 0).
      assert.equal(sb.info.computeRate, '0.000000');
      assert.equal(sb.info.computeCost, '0.000000');
      assert.equal(sb.info.modelCost, '0.000000');
      const r = await sb.commands.run('echo $GREETING');
      assert.equal(r.stdout, 'hello\n');
    } finally {
      await sb.kill();
    }
  });

  it('takes the template as a first argument', async () => {
    const sb = await Sandbox.create('base', { ...opts, size: 'xs' });
    try {
      assert.equal(sb.info.templateId, 'base');
    } finally {
      await sb.kill();
    }
  });

  it('wait: false answers at once; the sandbox comes up by itself', async () => {
    const sb = await make({ wait: false });
    try {
      assert.ok(['provisioning', 'running'].includes(sb.state), sb.state);
      for (let i = 0; i < 100 && sb.state !== 'running'; i++) {
        await new Promise((r) => setTimeout(r, 50));
        await sb.refresh();
      }
      assert.equal(sb.state, 'running');
    } finally {
      await sb.kill();
    }
  });

  it('reads CELLA_SERVER and CELLA_API_KEY', async () => {
    const saved = [process.env.CELLA_SERVER, process.env.CELLA_API_KEY];
    process.env.CELLA_SERVER = srv.url;
    process.env.CELLA_API_KEY = srv.key;
    try {
      const sb = await Sandbox.create({ size: 'xs' });
      assert.equal(sb.config.server, srv.url);
      assert.equal((await sb.kill()).state, 'destroyed');
    } finally {
      for (const [k, v] of [['CELLA_SERVER', saved[0]], ['CELLA_API_KEY', saved[1]]]) {
        if (v === undefined) delete process.env[k];
        else process.env[k] = v;
      }
    }
  });

  it('bad input: a timeout out of range is an InvalidRequestError naming the field', async () => {
    await assert.rejects(make({ timeoutSec: 0 }), (e) => {
      assert.ok(e instanceof InvalidRequestError);
      assert.ok(e instanceof CellaError);
      assert.equal(e.code, 'INVALID_REQUEST');
      assert.equal(e.status, 400);
      assert.equal(e.field, 'timeout_sec');
      assert.equal(e.details.field, 'timeout_sec');
      assert.match(e.requestId, /^\S+$/);
      assert.match(e.message, /timeout_sec/);
      return true;
    });
  });

  it('bad input: an unknown size and bad metadata', async () => {
    await assert.rejects(make({ size: 'huge' }), InvalidRequestError);
    await assert.rejects(make({ metadata: { 'bad key!': 'x' } }), (e) => e instanceof InvalidRequestError && /^metadata/.test(e.field));
  });

  it('not found: an unknown template', async () => {
    await assert.rejects(make({ template: 'no-such-template' }), (e) => e instanceof NotFoundError && e.status === 404);
  });

  it('wrong key: AuthenticationError; key without the scope: PermissionDeniedError', async () => {
    await assert.rejects(Sandbox.create({ ...opts, apiKey: 'not-a-key' }), (e) => {
      assert.ok(e instanceof AuthenticationError);
      assert.equal(e.status, 401);
      assert.ok(e.requestId);
      return true;
    });
    const me = await adminCall(srv, 'GET', '/api-keys');
    const key = await adminCall(srv, 'POST', '/api-keys', {
      workspace_id: me[0].workspace_id,
      name: 'read-only',
      scopes: ['sandboxes:read'],
    });
    await assert.rejects(Sandbox.create({ ...opts, apiKey: key.key }), (e) => {
      assert.ok(e instanceof PermissionDeniedError);
      assert.equal(e.status, 403);
      assert.equal(e.details.required_scope, 'sandboxes:write');
      return true;
    });
    // The read-only key still lists.
    assert.ok(Array.isArray(await Sandbox.list({ ...opts, apiKey: key.key })));
  });

  it('no server: ConnectionError', async () => {
    await assert.rejects(Sandbox.create({ server: 'http://127.0.0.1:1', apiKey: 'x', size: 'xs' }), (e) => {
      assert.ok(e instanceof ConnectionError);
      assert.equal(e.code, 'CONNECTION');
      return true;
    });
  });
});

describe('Sandbox.connect', () => {
  it('connects to a running sandbox', async () => {
    const sb = await make();
    try {
      const again = await Sandbox.connect(sb.id, opts);
      assert.equal(again.id, sb.id);
      assert.equal(again.state, 'running');
      assert.equal((await again.commands.run('echo ok')).stdout, 'ok\n');
    } finally {
      await sb.kill();
    }
  });

  it('resumes a paused sandbox, unless resume: false', async () => {
    const sb = await make();
    try {
      await sb.pause();
      const kept = await Sandbox.connect(sb.id, { ...opts, resume: false });
      assert.equal(kept.state, 'paused');
      const woken = await Sandbox.connect(sb.id, opts);
      assert.equal(woken.state, 'running');
    } finally {
      await sb.kill();
    }
  });

  it('not found: an unknown id', async () => {
    await assert.rejects(Sandbox.connect('sbnosuchsandbox00000', opts), NotFoundError);
  });
});

describe('Sandbox.list', () => {
  it('lists with state and metadata filters', async () => {
    const tag = `list-${Date.now()}`;
    const a = await make({ metadata: { suite: tag, role: 'a' } });
    const b = await make({ metadata: { suite: tag, role: 'b' } });
    try {
      await b.pause();
      const all = await Sandbox.list({ ...opts, metadata: { suite: tag } });
      assert.deepEqual(all.map((s) => s.id).sort(), [a.id, b.id].sort());
      assert.ok(all.every((s) => s.sandboxId === s.id));
      const paused = await Sandbox.list({ ...opts, metadata: { suite: tag }, state: 'paused' });
      assert.deepEqual(paused.map((s) => s.id), [b.id]);
      const onlyA = await Sandbox.list({ ...opts, metadata: { suite: tag, role: 'a' } });
      assert.deepEqual(onlyA.map((s) => s.id), [a.id]);
      // Pages are followed: a page size of 1 still gives both.
      const paged = await Sandbox.list({ ...opts, metadata: { suite: tag }, limit: 1 });
      assert.equal(paged.length, 2);
    } finally {
      await a.kill();
      await b.kill();
    }
  });

  it('bad input: an unknown state', async () => {
    await assert.rejects(Sandbox.list({ ...opts, state: 'sleeping' }), (e) => e instanceof InvalidRequestError && e.field === 'state');
  });
});

describe('lifecycle', () => {
  it('refresh reads the sandbox again; not found for an unknown id', async () => {
    const sb = await make();
    try {
      const info = await sb.refresh();
      assert.equal(info.id, sb.id);
      assert.equal(info.state, 'running');
      assert.equal(typeof info.timeoutRemainingMs, 'number');
      assert.deepEqual(await sb.getInfo(), sb.info);
    } finally {
      await sb.kill();
    }
    await assert.rejects(new Sandbox({ id: 'sbnosuchsandbox00000' }, opts).refresh(), NotFoundError);
  });

  it('pause and resume; pausing a paused one and resuming a running one conflict', async () => {
    const sb = await make();
    try {
      await sb.commands.run('echo kept > /tmp/mem');
      const paused = await sb.pause();
      assert.equal(paused.state, 'paused');
      assert.equal(paused.ready, false);
      await assert.rejects(sb.pause(), (e) => e instanceof ConflictError && e.details.state === 'paused' && e.status === 409);
      await assert.rejects(sb.commands.run('true'), SandboxNotRunningError);
      const resumed = await sb.resume();
      assert.equal(resumed.state, 'running');
      assert.equal((await sb.commands.run('cat /tmp/mem')).stdout, 'kept\n');
      await assert.rejects(sb.resume(), (e) => e instanceof ConflictError && e.details.state === 'running');
    } finally {
      await sb.kill();
    }
    await assert.rejects(new Sandbox({ id: 'sbnosuchsandbox00000' }, opts).pause(), NotFoundError);
    await assert.rejects(new Sandbox({ id: 'sbnosuchsandbox00000' }, opts).resume(), NotFoundError);
  });

  it('stop keeps the files and resume boots again; a sandbox that is not persistent cannot stop', async () => {
    const sb = await make();
    try {
      await sb.files.write('/home/user/keep.txt', 'still here');
      const stopped = await sb.stop();
      assert.equal(stopped.state, 'stopped');
      await assert.rejects(sb.stop(), ConflictError);
      await sb.resume();
      assert.equal(sb.state, 'running');
      assert.equal(await sb.files.read('/home/user/keep.txt'), 'still here');
    } finally {
      await sb.kill();
    }
    const eph = await make({ persistent: false });
    try {
      await assert.rejects(eph.stop(), (e) => e instanceof ConflictError && e.details.persistent === false);
    } finally {
      await eph.kill();
    }
  });

  it('setTimeout changes the timeout; out of range and on a destroyed sandbox fail', async () => {
    const sb = await make();
    try {
      const info = await sb.setTimeout(120);
      assert.equal(info.timeoutSec, 120);
      assert.ok(info.timeoutRemainingMs <= 120_000 && info.timeoutRemainingMs > 100_000);
      await assert.rejects(sb.setTimeout(0), (e) => e instanceof InvalidRequestError && e.field === 'timeout_sec');
      await assert.rejects(sb.setTimeout(86401), InvalidRequestError);
    } finally {
      await sb.kill();
    }
    await assert.rejects(sb.setTimeout(60), (e) => e instanceof ConflictError && e.details.state === 'destroyed');
  });

  it('usage reports running time, CPU and memory; not found for an unknown id', async () => {
    const sb = await make();
    try {
      await sb.commands.run('i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done');
      const u = await sb.usage();
      assert.equal(u.sandboxId, sb.id);
      assert.equal(u.state, 'running');
      assert.equal(typeof u.runningSec, 'number');
      assert.ok(u.cpuSec > 0);
      assert.ok(u.billedSec >= 1);
      assert.ok(u.measuredAt instanceof Date);
    } finally {
      await sb.kill();
    }
    assert.equal((await sb.usage()).state, 'destroyed');
    await assert.rejects(new Sandbox({ id: 'sbnosuchsandbox00000' }, opts).usage(), NotFoundError);
  });

  it('kill destroys, is idempotent, and fails for an unknown id', async () => {
    const sb = await make();
    const info = await sb.kill();
    assert.equal(info.state, 'destroyed');
    assert.ok(info.destroyedAt instanceof Date);
    assert.equal(typeof info.totalRuntimeSec, 'number');
    assert.equal((await sb.kill()).state, 'destroyed');
    await assert.rejects(sb.commands.run('true'), SandboxNotRunningError);
    await assert.rejects(new Sandbox({ id: 'sbnosuchsandbox00000' }, opts).kill(), NotFoundError);
  });

  it('Sandbox.kill destroys by id', async () => {
    const sb = await make();
    assert.equal((await Sandbox.kill(sb.id, opts)).state, 'destroyed');
    await assert.rejects(Sandbox.kill('sbnosuchsandbox00000', opts), NotFoundError);
  });

  it('Symbol.asyncDispose destroys the sandbox (await using)', async () => {
    assert.equal(typeof Symbol.asyncDispose, 'symbol');
    const sb = await make();
    await sb[Symbol.asyncDispose]();
    assert.equal((await sb.refresh()).state, 'destroyed');
    // Disposing twice, or a sandbox that never existed, is not an error.
    await sb[Symbol.asyncDispose]();
    await new Sandbox({ id: 'sbnosuchsandbox00000' }, opts)[Symbol.asyncDispose]();
  });
});

describe('fork', () => {
  it('forks a sandbox into new ones with its files', async (t) => {
    const sb = await make();
    try {
      await sb.files.write('/home/user/parent.txt', 'from the parent');
      let forks;
      try {
        forks = await sb.fork({ count: 2, metadata: { forked: 'yes' } });
      } catch (e) {
        if (await routeMissing(e, sb)) return t.skip(`the server has no fork route yet (${e.message}, ${e.requestId})`);
        throw e;
      }
      try {
        assert.equal(forks.length, 2);
        for (const f of forks) {
          assert.ok(f instanceof Sandbox);
          assert.notEqual(f.id, sb.id);
          assert.equal(f.info.metadata.forked, 'yes');
          for (let i = 0; i < 300 && f.state === 'provisioning'; i++) {
            await new Promise((r) => setTimeout(r, 100));
            await f.refresh();
          }
          if (f.state !== 'running') await f.resume();
          assert.equal(f.state, 'running');
          assert.equal(await f.files.read('/home/user/parent.txt'), 'from the parent');
        }
      } finally {
        for (const f of forks) await f.kill();
      }
    } finally {
      await sb.kill();
    }
  });

  it('errors: a count out of range, a destroyed sandbox, an unknown id', async (t) => {
    const sb = await make();
    try {
      try {
        await sb.fork({ count: 11 });
        assert.fail('fork with count 11 succeeded');
      } catch (e) {
        if (await routeMissing(e, sb)) return t.skip(`the server has no fork route yet (${e.message}, ${e.requestId})`);
        assert.ok(e instanceof InvalidRequestError, `${e}`);
      }
      await assert.rejects(new Sandbox({ id: 'sbnosuchsandbox00000' }, opts).fork(), NotFoundError);
      await sb.kill();
      await assert.rejects(sb.fork(), (e) => e instanceof ConflictError || e instanceof SandboxNotRunningError);
    } finally {
      await sb.kill();
    }
  });
});

describe('expose', () => {
  it('exposes a port and answers its URL', async (t) => {
    const sb = await make();
    try {
      let url;
      try {
        url = await sb.expose(8000);
      } catch (e) {
        if (await routeMissing(e, sb)) return t.skip(`the server has no expose route yet (${e.message}, ${e.requestId})`);
        throw e;
      }
      assert.equal(typeof url, 'string');
      assert.match(url, /^https?:\/\//);
      assert.ok(url.includes(sb.id) && url.includes('8000'), url);
      // getHost: the host of the port's own origin, without a scheme, as E2B's SDK answers it.
      const host = await sb.getHost(8000);
      assert.ok(host.startsWith(`8000-${sb.id}.`) && !host.includes('/'), host);
      // The URL opens with Node's own fetch (no wildcard DNS: the preview domain is localhost).
      await sb.files.write('/home/user/site/index.html', 'hello through the preview');
      await sb.commands.start('python3 -m http.server 8000 --bind 0.0.0.0', { cwd: '/home/user/site' });
      let r;
      for (let i = 0; i < 100; i++) {
        r = await fetch(url);
        if (r.status === 200) break;
        await new Promise((done) => setTimeout(done, 200)); // the web server is still starting
      }
      assert.equal(r.status, 200);
      assert.match(await r.text(), /hello through the preview/);
    } finally {
      await sb.kill();
    }
  });

  it('errors: a port out of range, a destroyed sandbox, an unknown id', async (t) => {
    const sb = await make();
    try {
      try {
        await sb.expose(0);
        assert.fail('expose of port 0 succeeded');
      } catch (e) {
        if (await routeMissing(e, sb)) return t.skip(`the server has no expose route yet (${e.message}, ${e.requestId})`);
        assert.ok(e instanceof InvalidRequestError, `${e}`);
      }
      await assert.rejects(new Sandbox({ id: 'sbnosuchsandbox00000' }, opts).expose(8000), NotFoundError);
      await sb.kill();
      await assert.rejects(sb.expose(8000), (e) => e instanceof SandboxNotRunningError || e instanceof ConflictError);
    } finally {
      await sb.kill();
    }
  });
});

describe('preview tokens', () => {
  it('a private preview opens with the token previewToken gives, and rotate ends the old ones', async () => {
    const sb = await Sandbox.create({ ...opts, size: 'xs', preview: { public: false } });
    try {
      await sb.files.write('/home/user/site/index.html', 'private page');
      await sb.commands.start('python3 -m http.server 8000 --bind 0.0.0.0', { cwd: '/home/user/site' });
      const url = new URL(await sb.expose(8000));
      url.search = '';
      const first = await sb.previewToken({ ttlSec: 600 });
      assert.equal(typeof first.token, 'string');
      assert.ok(first.expiresAt instanceof Date && first.expiresAt > new Date());
      let r;
      for (let i = 0; i < 100; i++) {
        r = await fetch(url, { headers: { 'x-cella-preview-token': first.token } });
        if (r.status === 200) break;
        await r.arrayBuffer();
        await new Promise((done) => setTimeout(done, 200)); // the web server is still starting
      }
      assert.equal(r.status, 200);
      assert.match(await r.text(), /private page/);
      const bare = await fetch(url);
      await bare.arrayBuffer();
      assert.ok([401, 403].includes(bare.status), `no token: ${bare.status}`);
      const second = await sb.previewToken({ rotate: true });
      assert.notEqual(second.token, first.token);
      const old = await fetch(url, { headers: { 'x-cella-preview-token': first.token } });
      await old.arrayBuffer();
      assert.ok([401, 403].includes(old.status), `rotated token: ${old.status}`);
      const fresh = await fetch(url, { headers: { 'x-cella-preview-token': second.token } });
      assert.equal(fresh.status, 200);
      await fresh.arrayBuffer();
      await assert.rejects(sb.previewToken({ ttlSec: -1 }), InvalidRequestError);
    } finally {
      await sb.kill();
    }
  });
});
