// Options are checked: an unknown option is a TypeError naming it, before any request; other
// SDKs' spellings of the same thing (`timeoutMs`, `envs`) mean what they say.

import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { Sandbox } from '@cella/sdk';
import { startServer } from './server.js';

let srv;
let opts;

before(async () => {
  srv = await startServer();
  opts = srv.opts;
});

after(async () => {
  await srv?.stop();
});

describe('options', () => {
  it('refuses unknown options by name and makes nothing', async () => {
    await assert.rejects(Sandbox.create({ ...opts, size: 'xs', timout: 60 }), (e) => {
      assert.ok(e instanceof TypeError);
      assert.match(e.message, /Sandbox\.create: unknown option "timout"/);
      return true;
    });
    assert.deepEqual(await Sandbox.list(opts), [], 'no sandbox was made');
    await assert.rejects(Sandbox.list({ ...opts, sate: 'running' }), /unknown option "sate"/);
  });

  it('lists lazily, a page at a time, or whole when awaited', async () => {
    const made = [];
    try {
      for (let i = 0; i < 3; i++) made.push(await Sandbox.create({ ...opts, size: 'xs', metadata: { lazy: 'yes' } }));
      const seen = [];
      for await (const s of Sandbox.list({ ...opts, metadata: { lazy: 'yes' }, limit: 1 })) {
        seen.push(s.id);
        if (seen.length === 2) break; // stops fetching: no third page is asked for
      }
      assert.deepEqual(seen, [made[2].id, made[1].id], 'newest first');
      const all = await Sandbox.list({ ...opts, metadata: { lazy: 'yes' }, limit: 1 });
      assert.equal(all.length, 3);
      await made[0].kill();
      const live = await Sandbox.list({ ...opts, metadata: { lazy: 'yes' } });
      assert.deepEqual(live.map((s) => s.id).sort(), [made[1].id, made[2].id].sort(), 'live ones by default');
      const every = await Sandbox.list({ ...opts, metadata: { lazy: 'yes' }, state: 'all' });
      assert.equal(every.length, 3);
    } finally {
      for (const sb of made) await sb.kill();
    }
  });

  it('takes timeoutMs and envs as other SDKs spell them', async () => {
    const sb = await Sandbox.create({ ...opts, size: 'xs', timeoutMs: 60_000, envs: { WHO: 'e2b-style' } });
    try {
      assert.equal(sb.info.timeoutSec, 60, 'timeoutMs is milliseconds');
      const r = await sb.commands.run('echo $WHO; sleep 5', { timeoutMs: 1000 });
      assert.equal(r.timedOut, true, 'the command was stopped after a second, not run for five');
      assert.equal(r.stdout, 'e2b-style\n');
      await assert.rejects(sb.commands.run('true', { timeOut: 5 }), /commands\.run: unknown option "timeOut"/);
      await assert.rejects(
        sb.commands.run('true', { timeoutMs: 1000, timeoutSec: 1 }),
        /give timeoutMs or timeoutSec, not both/,
      );
      const cell = await sb.runCode('import time; time.sleep(3)', { timeoutSec: 1 });
      assert.equal(cell.ok, false, 'code.run takes timeoutSec like commands');
      await assert.rejects(sb.runCode('1', { lang: 'python' }), /code\.run: unknown option "lang"/);
    } finally {
      await sb.kill();
    }
  });
});
