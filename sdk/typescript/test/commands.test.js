// Commands against a real server: run (one answer and streamed), start, background handles,
// output iteration, stdin, signals; an error path for each.

import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import {
  Sandbox,
  CommandHandle,
  NotFoundError,
  InvalidRequestError,
  SandboxNotRunningError,
  ConflictError,
} from '@cella/sdk';
import { startServer, sleepMs } from './server.js';

let srv;
let sb;
let paused;

before(async () => {
  srv = await startServer();
  sb = await Sandbox.create({ ...srv.opts, size: 'xs' });
  paused = await Sandbox.create({ ...srv.opts, size: 'xs' });
  await paused.pause();
});

after(async () => {
  await sb?.kill().catch(() => {});
  await paused?.kill().catch(() => {});
  await srv?.stop();
});

describe('commands.run', () => {
  it('runs a shell line and returns its output and exit code', async () => {
    const r = await sb.commands.run('echo out; echo err >&2; exit 3');
    assert.equal(r.exitCode, 3);
    assert.equal(r.stdout, 'out\n');
    assert.equal(r.stderr, 'err\n');
    assert.equal(r.timedOut, false);
    assert.equal(typeof r.durationMs, 'number');
    assert.equal(r.stdoutTruncated, false);
  });

  it('runs an argv array, with env, cwd, user and stdin', async () => {
    const r = await sb.commands.run(['sh', '-c', 'echo "$FOO $(pwd) $(id -u)"; cat'], {
      env: { FOO: 'bar' },
      cwd: '/tmp',
      user: 'root',
      stdin: 'from stdin',
    });
    assert.equal(r.exitCode, 0);
    assert.equal(r.stdout, 'bar /tmp 0\nfrom stdin');
    const u = await sb.commands.run('id -u; echo $HOME');
    assert.equal(u.stdout, '1000\n/home/user\n');
  });

  it('kills a command at its timeout', async () => {
    const r = await sb.commands.run('echo started; sleep 30', { timeoutSec: 1 });
    assert.equal(r.timedOut, true);
    assert.equal(r.exitCode, 137);
    assert.equal(r.stdout, 'started\n');
  });

  it('errors: a paused sandbox, a relative cwd, a missing cwd, a timeout out of range', async () => {
    await assert.rejects(paused.commands.run('true'), (e) => e instanceof SandboxNotRunningError && e.status === 409 && Boolean(e.requestId));
    await assert.rejects(sb.commands.run('true', { cwd: 'relative' }), (e) => e instanceof InvalidRequestError && e.field === 'cwd');
    await assert.rejects(sb.commands.run('true', { cwd: '/no/such/dir' }), (e) => e instanceof InvalidRequestError && e.field === 'cwd');
    await assert.rejects(sb.commands.run('true', { timeoutSec: 0 }), (e) => e instanceof InvalidRequestError && e.field === 'timeout_sec');
    await assert.rejects(sb.commands.run([]), (e) => e instanceof InvalidRequestError && e.field === 'argv');
    await assert.rejects(new Sandbox({ id: 'sbnosuchsandbox00000' }, srv.opts).commands.run('true'), NotFoundError);
    await assert.rejects(sb.commands.run(42), TypeError);
  });
});

describe('commands.run with callbacks (streamed exec)', () => {
  it('streams stdout and stderr as they come, then returns the result', async () => {
    const events = [];
    let firstAt = null;
    const r = await sb.commands.run('echo one; sleep 0.4; echo two >&2; sleep 0.4; echo three; exit 4', {
      onStdout: (d) => {
        firstAt ??= Date.now();
        events.push(['out', d]);
      },
      onStderr: (d) => events.push(['err', d]),
    });
    assert.deepEqual(events, [
      ['out', 'one\n'],
      ['err', 'two\n'],
      ['out', 'three\n'],
    ]);
    // The first line came while the command still ran (it sleeps 0.8 s after it).
    const doneAt = Date.now();
    assert.ok(doneAt - firstAt >= 500, `first output only ${doneAt - firstAt} ms before the end`);
    assert.equal(r.exitCode, 4);
    assert.equal(r.stdout, 'one\nthree\n');
    assert.equal(r.stderr, 'two\n');
    assert.equal(r.timedOut, false);
  });

  it('decodes bytes that are not UTF-8 (sent as base64)', async () => {
    const chunks = [];
    const r = await sb.commands.run("printf 'a\\377b'", { onStdout: (d) => chunks.push(d) });
    assert.equal(r.stdout, 'a\uFFFDb');
    assert.equal(chunks.join(''), 'a\uFFFDb');
  });

  it('awaits async callbacks, with env, cwd and timeout', async () => {
    const seen = [];
    const r = await sb.commands.run('echo $X; pwd; sleep 5', {
      env: { X: 'y' },
      cwd: '/tmp',
      timeoutSec: 1,
      onStdout: async (d) => {
        await sleepMs(10);
        seen.push(d);
      },
    });
    assert.equal(seen.join(''), 'y\n/tmp\n');
    assert.equal(r.timedOut, true);
    assert.equal(r.exitCode, 137);
  });

  it('errors: a paused sandbox before the stream, a missing cwd as the stream\'s error event', async () => {
    await assert.rejects(paused.commands.run('true', { onStdout: () => {} }), SandboxNotRunningError);
    await assert.rejects(sb.commands.run('true', { cwd: '/no/such/dir', onStdout: () => {} }), (e) => {
      assert.ok(e instanceof InvalidRequestError);
      assert.equal(e.field, 'cwd');
      assert.ok(e.requestId);
      return true;
    });
    await assert.rejects(sb.commands.run('true', { cwd: 'relative', onStderr: () => {} }), InvalidRequestError);
  });

  it('an AbortSignal ends the command', async () => {
    const ctrl = new AbortController();
    const p = sb.commands.run('echo go; sleep 30', {
      signal: ctrl.signal,
      onStdout: () => ctrl.abort(new Error('enough')),
    });
    await assert.rejects(p, (e) => e.message === 'enough');
  });

  it('a callback that throws ends the stream, and the server ends the command', async () => {
    await sb.files.remove('/tmp/late').catch(() => {});
    await assert.rejects(
      sb.commands.run('echo go; sleep 1; touch /tmp/late', {
        onStdout: () => {
          throw new Error('callback failed');
        },
      }),
      /callback failed/,
    );
    await sleepMs(1500);
    assert.equal(await sb.files.exists('/tmp/late'), false);
  });
});

describe('commands.start (background processes)', () => {
  it('starts a process, writes its stdin, waits for its exit', async () => {
    const h = await sb.commands.start('cat; echo bye >&2', { tag: 'cat' });
    assert.ok(h instanceof CommandHandle);
    assert.equal(typeof h.pid, 'number');
    assert.equal(h.tag, 'cat');
    assert.equal(h.info.state, 'running');
    assert.equal(h.exitCode, null);
    await h.sendStdin('hello ');
    await h.sendStdin(new TextEncoder().encode('world\n'));
    await h.closeStdin();
    const r = await h.wait();
    assert.equal(r.exitCode, 0);
    assert.equal(r.stdout, 'hello world\n');
    assert.equal(r.stderr, 'bye\n');
    assert.equal(h.exitCode, 0);
    const info = await h.refresh();
    assert.equal(info.state, 'exited');
    assert.equal(info.exitCode, 0);
    assert.ok(info.endedAt instanceof Date);
  });

  it('follows output through callbacks given at start', async () => {
    const out = [];
    const h = await sb.commands.start('for i in 1 2 3; do echo $i; sleep 0.1; done; exit 2', {
      onStdout: (d) => out.push(d),
      env: { A: 'b' },
      cwd: '/tmp',
    });
    const r = await h.wait();
    assert.equal(out.join(''), '1\n2\n3\n');
    assert.equal(r.exitCode, 2);
    assert.equal(r.stdout, '1\n2\n3\n');
  });

  it('is async-iterable over its output', async () => {
    const h = await sb.commands.start("echo a; echo b >&2; printf 'c\\377'");
    const chunks = [];
    for await (const c of h) chunks.push(c);
    assert.equal(chunks.filter((c) => c.type === 'stdout').map((c) => c.data).join(''), 'a\nc\uFFFD');
    assert.equal(chunks.filter((c) => c.type === 'stderr').map((c) => c.data).join(''), 'b\n');
    const raw = chunks.filter((c) => c.type === 'stdout').flatMap((c) => [...c.bytes]);
    assert.deepEqual(raw.slice(-2), [0x63, 0xff]);
    assert.equal(h.exitCode, 0);
  });

  it('output({from: "now"}) skips what was written before, and leaving does not stop it', async () => {
    const h = await sb.commands.start('echo early; read line; echo "got $line"');
    await sleepMs(300);
    const it = h.output({ from: 'now' })[Symbol.asyncIterator]();
    const next = it.next();
    await sleepMs(200);
    await h.sendStdin('x\n');
    const first = await next;
    assert.equal(first.value.data, 'got x\n');
    await it.return();
    const r = await h.wait();
    assert.equal(r.stdout, 'early\ngot x\n');
  });

  it('kill signals it; killing an exited process answers false', async () => {
    const h = await sb.commands.start('sleep 60');
    assert.equal(await h.kill(), true);
    const r = await h.wait();
    assert.equal(r.exitCode, 137);
    assert.equal(await h.kill(), false);
    const t = await sb.commands.start('sleep 60');
    assert.equal(await sb.commands.kill(t.pid, 'TERM'), true);
    assert.equal((await t.wait()).exitCode, 143);
    await assert.rejects(sb.commands.kill(t.pid, 'NOPE'), (e) => e instanceof InvalidRequestError && e.field === 'signal');
    await assert.rejects(sb.commands.kill(999999), NotFoundError);
  });

  it('lists and connects to processes', async () => {
    const h = await sb.commands.start('sleep 60', { tag: 'listed' });
    try {
      const list = await sb.commands.list();
      const mine = list.find((p) => p.pid === h.pid);
      assert.ok(mine);
      assert.equal(mine.tag, 'listed');
      assert.equal(mine.state, 'running');
      assert.deepEqual(mine.argv, ['/bin/bash', '-c', 'sleep 60']);
      const again = await sb.commands.connect(h.pid);
      assert.equal(again.pid, h.pid);
      assert.equal(again.info.state, 'running');
    } finally {
      await h.kill();
    }
    await assert.rejects(sb.commands.connect(999999), NotFoundError);
    await assert.rejects(paused.commands.list(), SandboxNotRunningError);
  });

  it('run with background: true returns a handle', async () => {
    const h = await sb.commands.run('echo bg', { background: true });
    assert.ok(h instanceof CommandHandle);
    assert.equal((await h.wait()).stdout, 'bg\n');
  });

  it('errors: a paused sandbox, a relative cwd, a program that does not exist, stdin after close', async () => {
    await assert.rejects(paused.commands.start('true'), SandboxNotRunningError);
    await assert.rejects(sb.commands.start('true', { cwd: 'relative' }), (e) => e instanceof InvalidRequestError && e.field === 'cwd');
    await assert.rejects(sb.commands.start(['/no/such/program']), (e) => e instanceof InvalidRequestError && e.field === 'command');
    await assert.rejects(sb.commands.start('true', { timeoutSec: 5 }), InvalidRequestError);
    const h = await sb.commands.start('cat');
    await h.closeStdin();
    await assert.rejects(h.sendStdin('late'), ConflictError);
    await h.wait();
    await assert.rejects(sb.commands.sendStdin(999999, 'x'), NotFoundError);
    const gone = new CommandHandle(sb, { pid: 999999 });
    await assert.rejects(gone.wait(), NotFoundError);
    await assert.rejects(gone.refresh(), NotFoundError);
    await assert.rejects(
      (async () => {
        for await (const _ of gone) break;
      })(),
      NotFoundError,
    );
  });
});
