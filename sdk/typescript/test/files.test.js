// Files against a real server: read, write, list, remove, makeDir, rename, exists, stat, watch;
// an error path for each.

import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import {
  Sandbox,
  NotFoundError,
  InvalidRequestError,
  SandboxNotRunningError,
  ConflictError,
  RangeNotSatisfiableError,
} from '@cella/sdk';
import { startServer, sleepMs } from './server.js';

let srv;
let sb;
let paused;
const home = '/home/user';

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

describe('files.write and files.read', () => {
  it('writes text and reads it back as text, bytes, blob and stream', async () => {
    const entry = await sb.files.write(`${home}/a/b/hello.txt`, 'héllo wörld\n');
    assert.equal(entry.path, `${home}/a/b/hello.txt`);
    assert.equal(entry.name, 'hello.txt');
    assert.equal(entry.type, 'file');
    assert.equal(entry.size, Buffer.byteLength('héllo wörld\n'));
    assert.equal(entry.mode, '0644');
    assert.equal(entry.uid, 1000);
    assert.ok(entry.modifiedAt instanceof Date);
    assert.equal(await sb.files.read(`${home}/a/b/hello.txt`), 'héllo wörld\n');
    assert.equal(await sb.files.read(`${home}/a/b/hello.txt`, { format: 'text' }), 'héllo wörld\n');
    const bytes = await sb.files.read(`${home}/a/b/hello.txt`, { format: 'bytes' });
    assert.ok(bytes instanceof Uint8Array);
    assert.equal(Buffer.from(bytes).toString('utf8'), 'héllo wörld\n');
    const blob = await sb.files.read(`${home}/a/b/hello.txt`, { format: 'blob' });
    assert.equal(await blob.text(), 'héllo wörld\n');
    const stream = await sb.files.read(`${home}/a/b/hello.txt`, { format: 'stream' });
    assert.equal(await new Response(stream).text(), 'héllo wörld\n');
    // The commands see it too.
    assert.equal((await sb.commands.run(`cat ${home}/a/b/hello.txt`)).stdout, 'héllo wörld\n');
  });

  it('writes bytes, Blobs, streams and async iterables, with a mode and an owner', async () => {
    const bin = new Uint8Array(256).map((_, i) => i);
    await sb.files.write(`${home}/bin.dat`, bin);
    assert.deepEqual(await sb.files.read(`${home}/bin.dat`, { format: 'bytes' }), bin);
    await sb.files.write(`${home}/blob.txt`, new Blob(['from ', 'a blob']));
    assert.equal(await sb.files.read(`${home}/blob.txt`), 'from a blob');
    const rs = new ReadableStream({
      start(c) {
        c.enqueue(new TextEncoder().encode('streamed '));
        c.enqueue(new TextEncoder().encode('body'));
        c.close();
      },
    });
    await sb.files.write(`${home}/stream.txt`, rs);
    assert.equal(await sb.files.read(`${home}/stream.txt`), 'streamed body');
    async function* gen() {
      yield 'gen';
      yield Buffer.from('erated');
    }
    await sb.files.write(`${home}/gen.txt`, gen());
    assert.equal(await sb.files.read(`${home}/gen.txt`), 'generated');
    const script = await sb.files.write(`${home}/run.sh`, '#!/bin/sh\necho ran\n', { mode: 0o755 });
    assert.equal(script.mode, '0755');
    assert.equal((await sb.commands.run(`${home}/run.sh`)).stdout, 'ran\n');
    const owned = await sb.files.write('/opt/root.txt', 'r', { user: 'root', mode: '0600' });
    assert.equal(owned.uid, 0);
    assert.equal(owned.mode, '0600');
  });

  it('writes several files at once', async () => {
    const entries = await sb.files.write([
      { path: `${home}/multi/one.txt`, data: '1' },
      { path: `${home}/multi/two.txt`, data: '2' },
    ]);
    assert.deepEqual(entries.map((e) => e.name), ['one.txt', 'two.txt']);
    assert.equal(await sb.files.read(`${home}/multi/two.txt`), '2');
  });

  it('reads a byte range', async () => {
    await sb.files.write(`${home}/range.txt`, '0123456789');
    assert.equal(await sb.files.read(`${home}/range.txt`, { range: { start: 2, end: 4 } }), '234');
    assert.equal(await sb.files.read(`${home}/range.txt`, { range: { start: 7 } }), '789');
    assert.equal(await sb.files.read(`${home}/range.txt`, { range: '-3' }), '789');
    await assert.rejects(sb.files.read(`${home}/range.txt`, { range: { start: 50 } }), (e) => {
      assert.ok(e instanceof RangeNotSatisfiableError);
      assert.equal(e.status, 416);
      assert.equal(e.details.size, 10);
      return true;
    });
  });

  it('read errors: a missing file, a directory, a relative path, /proc, a paused sandbox, a bad format', async () => {
    await assert.rejects(sb.files.read(`${home}/missing.txt`), (e) => e instanceof NotFoundError && e.status === 404);
    await assert.rejects(sb.files.read(home), ConflictError);
    await assert.rejects(sb.files.read('relative.txt'), (e) => e instanceof InvalidRequestError && e.field === 'path');
    await assert.rejects(sb.files.read('/proc/1/environ'), InvalidRequestError);
    await assert.rejects(paused.files.read('/etc/hostname'), SandboxNotRunningError);
    await assert.rejects(sb.files.read('/etc/hostname', { format: 'yaml' }), TypeError);
  });

  it('write errors: a relative path, a directory in the way, a kernel interface, a paused sandbox', async () => {
    await assert.rejects(sb.files.write('relative.txt', 'x'), (e) => e instanceof InvalidRequestError && e.field === 'path');
    await sb.files.makeDir(`${home}/adir`);
    await assert.rejects(sb.files.write(`${home}/adir`, 'x'), ConflictError);
    await assert.rejects(sb.files.write('/sys/kernel/nope', 'x'), InvalidRequestError);
    await assert.rejects(paused.files.write('/tmp/x', 'x'), SandboxNotRunningError);
    await assert.rejects(sb.files.write(`${home}/bad-mode`, 'x', { mode: 'rwx' }), InvalidRequestError);
    await assert.rejects(sb.files.write(`${home}/bad`, 42), TypeError);
  });
});

describe('files.list', () => {
  it('lists a directory, recursively, with a limit', async () => {
    await sb.files.write(`${home}/tree/x.txt`, 'x');
    await sb.files.write(`${home}/tree/sub/y.txt`, 'yy');
    const flat = await sb.files.list(`${home}/tree`);
    assert.deepEqual(flat.map((e) => [e.name, e.type]), [['sub', 'dir'], ['x.txt', 'file']]);
    assert.equal(flat.truncated, false);
    const deep = await sb.files.list(`${home}/tree`, { recursive: true });
    assert.deepEqual(deep.map((e) => e.path), [`${home}/tree/sub`, `${home}/tree/sub/y.txt`, `${home}/tree/x.txt`]);
    assert.equal(deep[1].size, 2);
    const cut = await sb.files.list(`${home}/tree`, { recursive: true, limit: 1 });
    assert.equal(cut.length, 1);
    assert.equal(cut.truncated, true);
  });

  it('errors: a missing directory, a file, a paused sandbox', async () => {
    await assert.rejects(sb.files.list(`${home}/nowhere`), NotFoundError);
    await sb.files.write(`${home}/plain.txt`, 'p');
    await assert.rejects(sb.files.list(`${home}/plain.txt`), ConflictError);
    await assert.rejects(paused.files.list('/'), SandboxNotRunningError);
  });
});

describe('files.remove, makeDir, rename', () => {
  it('removes files and directories', async () => {
    await sb.files.write(`${home}/rm/one.txt`, '1');
    await sb.files.remove(`${home}/rm/one.txt`);
    assert.equal(await sb.files.exists(`${home}/rm/one.txt`), false);
    await sb.files.write(`${home}/rm/deep/two.txt`, '2');
    await assert.rejects(sb.files.remove(`${home}/rm`), ConflictError);
    await sb.files.remove(`${home}/rm`, { recursive: true });
    assert.equal(await sb.files.exists(`${home}/rm`), false);
  });

  it('remove errors: a missing path, /, a paused sandbox', async () => {
    await assert.rejects(sb.files.remove(`${home}/never`), NotFoundError);
    await assert.rejects(sb.files.remove('/', { recursive: true }), InvalidRequestError);
    await assert.rejects(paused.files.remove('/tmp/x'), SandboxNotRunningError);
  });

  it('makes directories with their parents', async () => {
    const d = await sb.files.makeDir(`${home}/m/n/o`);
    assert.equal(d.type, 'dir');
    assert.equal(d.path, `${home}/m/n/o`);
    assert.equal((await sb.files.makeDir(`${home}/m/n/o`)).type, 'dir');
    assert.equal((await sb.files.stat(`${home}/m/n`)).uid, 1000);
  });

  it('makeDir errors: a file in the way, a relative path, a paused sandbox', async () => {
    await sb.files.write(`${home}/file-in-way`, 'x');
    await assert.rejects(sb.files.makeDir(`${home}/file-in-way/sub`), ConflictError);
    await assert.rejects(sb.files.makeDir('rel/dir'), InvalidRequestError);
    await assert.rejects(paused.files.makeDir('/tmp/d'), SandboxNotRunningError);
  });

  it('renames files', async () => {
    await sb.files.write(`${home}/old.txt`, 'moved');
    const e = await sb.files.rename(`${home}/old.txt`, `${home}/new.txt`);
    assert.equal(e.path, `${home}/new.txt`);
    assert.equal(await sb.files.read(`${home}/new.txt`), 'moved');
    assert.equal(await sb.files.exists(`${home}/old.txt`), false);
  });

  it('rename errors: a missing source, a full directory in the way, a paused sandbox', async () => {
    await assert.rejects(sb.files.rename(`${home}/ghost`, `${home}/ghost2`), NotFoundError);
    await sb.files.write(`${home}/full/x`, 'x');
    await sb.files.makeDir(`${home}/emptydir`);
    await assert.rejects(sb.files.rename(`${home}/emptydir`, `${home}/full`), ConflictError);
    await assert.rejects(sb.files.rename('rel', `${home}/x`), InvalidRequestError);
    await assert.rejects(paused.files.rename('/tmp/a', '/tmp/b'), SandboxNotRunningError);
  });
});

describe('files.exists and files.stat', () => {
  it('tells whether paths exist and describes them', async () => {
    await sb.files.write(`${home}/s.txt`, 'stat me');
    await sb.commands.run(`ln -s s.txt ${home}/link`);
    assert.equal(await sb.files.exists(`${home}/s.txt`), true);
    assert.equal(await sb.files.exists(`${home}/nope.txt`), false);
    const st = await sb.files.stat(`${home}/s.txt`);
    assert.equal(st.size, 7);
    assert.equal(st.type, 'file');
    assert.equal(st.symlinkTarget, null);
    const link = await sb.files.getInfo(`${home}/link`);
    assert.equal(link.type, 'symlink');
    assert.equal(link.symlinkTarget, 's.txt');
  });

  it('errors: stat of a missing path; exists on a paused sandbox or a bad path throws', async () => {
    await assert.rejects(sb.files.stat(`${home}/nope.txt`), NotFoundError);
    await assert.rejects(sb.files.stat('rel'), InvalidRequestError);
    await assert.rejects(paused.files.exists('/etc/hostname'), SandboxNotRunningError);
    await assert.rejects(sb.files.exists('/proc/self'), InvalidRequestError);
    await assert.rejects(paused.files.stat('/etc/hostname'), SandboxNotRunningError);
  });
});

/** Collects a watch's events until `until` says enough, or the deadline passes. */
async function collect(w, until, ms = 5000) {
  const events = [];
  const timer = setTimeout(() => w.stop(), ms);
  for await (const ev of w) {
    events.push(ev);
    if (until(events)) break;
  }
  clearTimeout(timer);
  await w.stop();
  return events;
}

describe('files.watch', () => {
  it('yields create, modify, rename and delete events', async () => {
    await sb.files.makeDir(`${home}/watched`);
    const w = await sb.files.watch(`${home}/watched`);
    await sb.commands.run(`cd ${home}/watched && echo a > a.txt && mv a.txt b.txt && mkdir d && rm b.txt`);
    const events = await collect(w, (evs) => evs.some((e) => e.type === 'delete' && e.path.endsWith('b.txt')));
    const seen = events.map((e) => `${e.type} ${e.path.slice(home.length + 9)}${e.dir ? '/' : ''}`);
    assert.deepEqual(seen, ['create a.txt', 'modify a.txt', 'rename b.txt', 'create d/', 'delete b.txt']);
    assert.equal(events[2].from, `${home}/watched/a.txt`);
  });

  it('watches recursively, and through onEvent', async () => {
    await sb.files.makeDir(`${home}/rwatch/sub`);
    const got = [];
    const w = await sb.files.watch(`${home}/rwatch`, { recursive: true, onEvent: (e) => got.push(e) });
    await sb.commands.run(`echo hi > ${home}/rwatch/sub/deep.txt`);
    for (let i = 0; i < 50 && !got.some((e) => e.type === 'modify'); i++) await sleepMs(100);
    await w.stop();
    assert.ok(got.some((e) => e.type === 'create' && e.path === `${home}/rwatch/sub/deep.txt`), JSON.stringify(got));
    assert.ok(got.some((e) => e.type === 'modify' && e.path === `${home}/rwatch/sub/deep.txt`), JSON.stringify(got));
  });

  it('stop() ends the iteration', async () => {
    await sb.files.makeDir(`${home}/quiet`);
    const w = await sb.files.watch(`${home}/quiet`);
    setTimeout(() => w.stop(), 200);
    const events = [];
    for await (const ev of w) events.push(ev);
    assert.deepEqual(events, []);
  });

  it('errors: a missing directory, a file, a paused sandbox', async () => {
    await assert.rejects(sb.files.watch(`${home}/no-such-dir`), NotFoundError);
    await sb.files.write(`${home}/wfile`, 'x');
    await assert.rejects(sb.files.watch(`${home}/wfile`), ConflictError);
    await assert.rejects(sb.files.watch('/proc'), InvalidRequestError);
    await assert.rejects(paused.files.watch('/tmp'), SandboxNotRunningError);
  });
});
