// Terminals against a real server: a command on a pseudo-terminal, its output and exit code;
// typing into a login shell, resizing it, hanging it up; the errors. Node 20 needs
// --experimental-websocket for its WebSocket class (run-tests.sh passes it).

import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { Sandbox, PtyHandle, SandboxNotRunningError, ConnectionError } from '@cella/sdk';
import { startServer } from './server.js';

let srv;
let sb;
const decoder = new TextDecoder();

before(async () => {
  srv = await startServer();
  sb = await Sandbox.create({ ...srv.opts, size: 'xs' });
});

after(async () => {
  await sb?.kill().catch(() => {});
  await srv?.stop();
});

describe('sandbox.pty', { skip: typeof WebSocket === 'undefined' && 'no WebSocket class in this runtime' }, () => {
  it('runs a command on a terminal: its output, a tty, its exit code', async () => {
    const seen = [];
    const term = await sb.pty.create({ command: 'tty; stty size; printf "%s\\n" "$TERM"; exit 7', cols: 100, rows: 30, onData: (b) => seen.push(b) });
    assert.ok(term instanceof PtyHandle);
    let out = '';
    for await (const chunk of term) out += decoder.decode(chunk);
    assert.equal(await term.wait(), 7);
    assert.equal(term.exitCode, 7);
    assert.match(out, /\/dev\/pts\/\d+/);
    assert.match(out, /30 100/);
    assert.match(out, /xterm-256color/);
    assert.equal(seen.map((b) => decoder.decode(b)).join(''), out, 'onData saw the same bytes');
  });

  it('types into a shell, resizes it, and exits', async () => {
    const term = await sb.pty.create({ cwd: '/tmp' });
    term.resize({ cols: 132, rows: 43 });
    term.sendInput('stty size; pwd; exit 0\n');
    let out = '';
    for await (const chunk of term) out += decoder.decode(chunk);
    assert.match(out, /43 132/);
    assert.match(out, /\/tmp/);
    assert.equal(await term.wait(), 0);
  });

  it('kill() hangs the terminal up and ends its program', async () => {
    const term = await sb.pty.create({ command: 'echo started > /tmp/hup.txt; sleep 300' });
    for (let i = 0; i < 50 && !(await sb.files.exists('/tmp/hup.txt')); i++) await new Promise((r) => setTimeout(r, 100));
    await term.kill();
    assert.equal(term.exitCode, null, 'no exit frame after a hang-up');
    let left = '';
    for (let i = 0; i < 50; i++) {
      left = (await sb.commands.run('pgrep -x sleep || true')).stdout.trim();
      if (!left) break;
      await new Promise((r) => setTimeout(r, 100));
    }
    assert.equal(left, '', 'the program was killed');
  });

  it('errors: a paused sandbox, a bad option', async () => {
    const paused = await Sandbox.create({ ...srv.opts, size: 'xs' });
    try {
      await paused.pause();
      await assert.rejects(paused.pty.create(), SandboxNotRunningError);
    } finally {
      await paused.kill();
    }
    await assert.rejects(sb.pty.create({ colums: 80 }), TypeError);
    await assert.rejects(sb.pty.create({ cwd: 'relative' }), ConnectionError);
  });
});
