// The checks every Cella SDK's suite makes (sdk/*/run-tests.sh): a 10 MiB file round trip with
// a checksum, and one error per family, each the typed error a user would catch: 401, 403,
// 404, 409, 413 and 429.

import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { createHash, randomBytes } from 'node:crypto';
import {
  Sandbox,
  CellaError,
  AuthenticationError,
  PermissionDeniedError,
  NotFoundError,
  ConflictError,
  PayloadTooLargeError,
  RateLimitedError,
} from '@cella/sdk';
import { adminCall, startServer } from './server.js';

let srv;
let sb;
const sha256 = (bytes) => createHash('sha256').update(bytes).digest('hex');

before(async () => {
  // Lifecycle calls (create, pause, ...) keep their default limits; a tight read limit is
  // tested on a server of its own below.
  srv = await startServer();
  sb = await Sandbox.create({ ...srv.opts, size: 'xs' });
});

after(async () => {
  await sb?.kill().catch(() => {});
  await srv?.stop();
});

describe('a 10 MiB file', () => {
  it('goes in and comes back byte for byte, with the same SHA-256 inside the sandbox', async () => {
    const data = new Uint8Array(randomBytes(10 * 1024 * 1024));
    const want = sha256(data);
    const entry = await sb.files.write('/home/user/big.bin', data);
    assert.equal(entry.size, data.length);
    const inside = await sb.commands.run('sha256sum /home/user/big.bin');
    assert.equal(inside.stdout.split(' ')[0], want);
    const back = await sb.files.read('/home/user/big.bin', { format: 'bytes' });
    assert.equal(back.length, data.length);
    assert.equal(sha256(back), want);
    // And as a stream.
    const chunks = [];
    for await (const c of await sb.files.read('/home/user/big.bin', { format: 'stream' })) chunks.push(c);
    assert.equal(sha256(Buffer.concat(chunks)), want);
  });
});

describe('error families', () => {
  it('401: an unknown key is AuthenticationError', async () => {
    await assert.rejects(Sandbox.list({ ...srv.opts, apiKey: 'cella_not_a_key' }), (e) => {
      assert.ok(e instanceof AuthenticationError && e instanceof CellaError);
      assert.equal(e.status, 401);
      assert.equal(e.code, 'UNAUTHORIZED');
      return true;
    });
  });

  it('403: a key without the scope is PermissionDeniedError', async () => {
    const keys = await adminCall(srv, 'GET', '/api-keys');
    const key = await adminCall(srv, 'POST', '/api-keys', { workspace_id: keys[0].workspace_id, name: 'ro', scopes: ['sandboxes:read'] });
    const readOnly = new Sandbox({ id: sb.id }, { ...srv.opts, apiKey: key.key });
    assert.equal((await readOnly.refresh()).state, 'running', 'the key reads');
    await assert.rejects(readOnly.pause(), (e) => {
      assert.ok(e instanceof PermissionDeniedError);
      assert.equal(e.status, 403);
      assert.equal(e.code, 'FORBIDDEN');
      return true;
    });
    assert.equal((await sb.refresh()).state, 'running', 'nothing changed');
  });

  it('404: an unknown sandbox is NotFoundError', async () => {
    await assert.rejects(Sandbox.connect('sbnothere', srv.opts), (e) => e instanceof NotFoundError && e.status === 404 && e.code === 'NOT_FOUND');
  });

  it('409: pausing a paused sandbox is ConflictError', async () => {
    const other = await Sandbox.create({ ...srv.opts, size: 'xs' });
    try {
      await other.pause();
      await assert.rejects(other.pause(), (e) => e instanceof ConflictError && e.status === 409 && e.code === 'CONFLICT');
    } finally {
      await other.kill();
    }
  });

  it('413: a command body over 4 MiB is PayloadTooLargeError, and nothing runs', async () => {
    const stdin = 'x'.repeat(5 * 1024 * 1024);
    await assert.rejects(sb.commands.run('cat > /home/user/huge.txt', { stdin }), (e) => {
      assert.ok(e instanceof PayloadTooLargeError);
      assert.equal(e.status, 413);
      assert.equal(e.code, 'PAYLOAD_TOO_LARGE');
      return true;
    });
    assert.equal(await sb.files.exists('/home/user/huge.txt'), false);
  });

  it('429: past the rate limit, once the retries run out, RateLimitedError with Retry-After', async () => {
    const tight = await startServer({ config: '[rate_limits]\nread = { per_second = 1.0, burst = 1 }\n' });
    try {
      await Sandbox.list(tight.opts).catch(() => {});
      await assert.rejects(Sandbox.list({ ...tight.opts, maxRetries: 0 }), (e) => {
        assert.ok(e instanceof RateLimitedError);
        assert.equal(e.status, 429);
        assert.equal(e.code, 'RATE_LIMITED');
        assert.ok(e.retryAfter > 0);
        return true;
      });
    } finally {
      await tight.stop();
    }
  });
});
