// Snapshots, one-shot runs with artifacts, and custom templates against a real server; an
// error path for each.

import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import {
  Sandbox,
  Snapshot,
  Artifact,
  Template,
  TemplateBuild,
  TemplateBuildError,
  NotFoundError,
  InvalidRequestError,
  ConflictError,
} from '@cella/sdk';
import { startServer } from './server.js';
import { existsSync } from 'node:fs';

const hasRunsc = () => ['/usr/bin/runsc', '/usr/sbin/runsc', '/usr/local/bin/runsc'].some((p) => existsSync(p));

let srv;
const home = '/home/user';
const templateId = () => `sdk-tpl-${randomBytes(5).toString('hex')}`;

before(async () => {
  srv = await startServer();
});

after(async () => {
  await srv?.stop();
});

describe('snapshots', () => {
  it('snapshots a sandbox, starts another from it with the old files, deletes it', async () => {
    const sb = await Sandbox.create({ ...srv.opts, size: 'xs' });
    try {
      await sb.files.write(`${home}/state.txt`, 'before\n');
      const snap = await sb.createSnapshot();
      assert.match(snap.id, /^snap/);
      assert.equal(snap.sandboxId, sb.id);
      assert.equal(snap.templateId, 'base');
      assert.equal(snap.size, 'xs');
      assert.ok(snap.createdAt instanceof Date);
      assert.ok(snap.sizeBytes > 0);
      assert.equal(snap.memory, false);
      await sb.files.write(`${home}/state.txt`, 'after\n');

      assert.deepEqual(await Snapshot.get(snap.id, srv.opts), snap);
      assert.ok((await Snapshot.list(srv.opts)).some((s) => s.id === snap.id));
      const restored = await Sandbox.create({ ...srv.opts, snapshotId: snap.id });
      try {
        assert.notEqual(restored.id, sb.id);
        assert.equal(restored.info.size, 'xs');
        assert.equal(await restored.files.read(`${home}/state.txt`), 'before\n');
      } finally {
        await restored.kill();
      }
      assert.equal(await sb.files.read(`${home}/state.txt`), 'after\n');
      assert.equal((await Snapshot.delete(snap.id, srv.opts)).id, snap.id);
      await assert.rejects(Snapshot.get(snap.id, srv.opts), NotFoundError);
      await assert.rejects(Sandbox.create({ ...srv.opts, snapshotId: snap.id }), NotFoundError);
    } finally {
      await sb.kill();
    }
  });

  it('with memory on gVisor: a sandbox made from it continues where the source was; so does a fork', { skip: !hasRunsc() && 'runsc is not installed' }, async () => {
    const sb = await Sandbox.create({ ...srv.opts, size: 'xs', runtime: 'gvisor' });
    try {
      assert.ok((await sb.runCode('counter = 41')).ok);
      const snap = await sb.createSnapshot({ memory: true });
      try {
        assert.equal(snap.memory, true);
        assert.equal(snap.sandboxId, sb.id);
        assert.equal((await Snapshot.get(snap.id, srv.opts)).memory, true);
        assert.ok((await sb.runCode('counter = 0')).ok); // the source goes on; the snapshot does not
        const copy = await Sandbox.create({ ...srv.opts, snapshotId: snap.id });
        try {
          assert.notEqual(copy.id, sb.id);
          assert.equal(copy.info.runtime, 'gvisor');
          assert.equal((await copy.runCode('counter + 1')).text, '42');
        } finally {
          await copy.kill();
        }
        assert.equal((await sb.runCode('counter')).text, '0');
      } finally {
        assert.equal((await Snapshot.delete(snap.id, srv.opts)).id, snap.id);
      }
      const [child] = await sb.fork();
      try {
        assert.equal(child.info.runtime, 'gvisor');
        assert.equal((await child.runCode('counter + 2')).text, '2');
      } finally {
        await child.kill();
      }
    } finally {
      await sb.kill();
    }
  });

  it('with memory on a namespace sandbox is an InvalidRequestError naming memory; nothing is made', async () => {
    const sb = await Sandbox.create({ ...srv.opts, size: 'xs', runtime: 'namespace' });
    try {
      await assert.rejects(sb.createSnapshot({ memory: true }), (e) => {
        assert.ok(e instanceof InvalidRequestError);
        assert.equal(e.status, 400);
        assert.equal(e.field, 'memory');
        assert.match(e.message, /namespace/);
        return true;
      });
      assert.ok(!(await Snapshot.list(srv.opts)).some((s) => s.sandboxId === sb.id));
      assert.equal((await sb.refresh()).state, 'running');
    } finally {
      await sb.kill();
    }
  });

  it('answers 404 for an unknown snapshot', async () => {
    const ghost = 'snap000000000000000000';
    await assert.rejects(Snapshot.get(ghost, srv.opts), (e) => e instanceof NotFoundError && e.status === 404);
    await assert.rejects(Snapshot.delete(ghost, srv.opts), NotFoundError);
    await assert.rejects(new Sandbox({ id: 'sb000000000000000000' }, srv.opts).createSnapshot(), NotFoundError);
  });
});

describe('one-shot runs and artifacts', () => {
  it('runs a command with files and downloads its artifacts after the run', async () => {
    const r = await Sandbox.run({
      ...srv.opts,
      command: 'mkdir -p out && sort in.csv > out/sorted.csv && cp bin.dat out/ && wc -l < in.csv && echo $MODE >&2',
      files: { 'in.csv': 'b,2\na,1\n', 'bin.dat': new Uint8Array([0, 1, 2, 255]) },
      artifacts: ['out/*'],
      env: { MODE: 'test' },
      size: 'xs',
      timeoutSec: 60,
    });
    assert.equal(r.exitCode, 0);
    assert.equal(r.timedOut, false);
    assert.equal(r.stdout, '2\n');
    assert.equal(r.stderr, 'test\n');
    assert.match(r.sandboxId, /^sb/);
    assert.equal((await Sandbox.connect(r.sandboxId, srv.opts)).state, 'destroyed');
    const byPath = Object.fromEntries(r.artifacts.map((a) => [a.path, a]));
    const sorted = byPath[`${home}/out/sorted.csv`];
    assert.match(sorted.id, /^art/);
    assert.equal(sorted.size, 8);
    assert.equal(sorted.sandboxId, r.sandboxId);
    assert.ok(sorted.url.endsWith(`/api/v1/artifacts/${sorted.id}`));
    assert.ok(sorted.expiresAt > sorted.createdAt);
    assert.equal(await sorted.read({ format: 'text' }), 'a,1\nb,2\n');
    assert.deepEqual(await Artifact.download(byPath[`${home}/out/bin.dat`], srv.opts), new Uint8Array([0, 1, 2, 255]));
    assert.equal(await new Response(await Artifact.download(sorted.id, { ...srv.opts, format: 'stream' })).text(), 'a,1\nb,2\n');
    const listed = await Artifact.list({ ...srv.opts, sandboxId: r.sandboxId });
    assert.deepEqual(listed.map((a) => a.id).sort(), r.artifacts.map((a) => a.id).sort());
    for (const a of r.artifacts) assert.equal((await Artifact.delete(a, srv.opts)).id, a.id);
    await assert.rejects(Artifact.download(sorted, srv.opts), NotFoundError);
  });

  it('takes argv, and returns a failing exit code as a result', async () => {
    const r = await Sandbox.run(['sh', '-c', 'echo oops >&2; exit 3'], { ...srv.opts, size: 'xs' });
    assert.equal(r.exitCode, 3);
    assert.equal(r.stderr, 'oops\n');
    assert.deepEqual(r.artifacts, []);
  });

  it('collects artifacts from a running sandbox', async () => {
    const sb = await Sandbox.create({ ...srv.opts, size: 'xs' });
    try {
      await sb.files.write(`${home}/res/a.json`, '{"a":1}');
      const arts = await sb.collectArtifacts(['res/*.json']);
      assert.deepEqual(arts.map((a) => a.path), [`${home}/res/a.json`]);
      assert.equal(await arts[0].read({ format: 'text' }), '{"a":1}');
      await assert.rejects(sb.collectArtifacts([]), InvalidRequestError);
    } finally {
      await sb.kill();
    }
  });

  it('runs on the gVisor runtime when asked, and creates gVisor sandboxes', { skip: !hasRunsc() && 'runsc is not installed' }, async () => {
    const r = await Sandbox.run({ ...srv.opts, runtime: 'gvisor', size: 'xs', command: 'echo hi > out.txt; cat /proc/version; dmesg 2>/dev/null | head -3', artifacts: ['out.txt'] });
    assert.equal(r.exitCode, 0, r.stderr);
    assert.match(r.stdout, /gVisor|4\.4\.0/);
    assert.equal(await r.artifacts[0].read({ format: 'text' }), 'hi\n');
    const gone = await Sandbox.connect(r.sandboxId, { ...srv.opts, resume: false });
    assert.equal(gone.info.runtime, 'gvisor');
    const sb = await Sandbox.create({ ...srv.opts, size: 'xs', runtime: 'gvisor' });
    try {
      assert.equal(sb.info.runtime, 'gvisor');
      assert.equal((await sb.commands.run('echo ok')).stdout, 'ok\n');
    } finally {
      await sb.kill();
    }
    await assert.rejects(
      Sandbox.run({ ...srv.opts, runtime: 'nope', command: 'true' }),
      (e) => e instanceof InvalidRequestError && e.field === 'runtime',
    );
  });

  it('refuses a run without a command with InvalidRequestError', async () => {
    await assert.rejects(
      Sandbox.run({ ...srv.opts, files: { 'a.txt': 'x' } }),
      (e) => e instanceof InvalidRequestError && e.status === 400 && e.field === 'command',
    );
    await assert.rejects(Artifact.download('art000000000000000000', srv.opts), NotFoundError);
  });
});

describe('custom templates', () => {
  it('builds a template, follows its log, starts a sandbox from it, deletes it', async () => {
    const id = templateId();
    const build = await Template.build({ id, steps: [{ run: 'echo hi > /opt/hi.txt' }] }, srv.opts);
    assert.ok(build instanceof TemplateBuild);
    assert.match(build.id, /^bld/);
    assert.equal(build.templateId, id);
    const pieces = [];
    const done = await build.wait({ onLog: (t) => pieces.push(t), timeoutMs: 120_000, check: true });
    try {
      assert.equal(done.state, 'ready');
      assert.equal(done.error, null);
      assert.ok(done.finishedAt instanceof Date);
      assert.equal(done.steps[0].kind, 'run');
      assert.equal(pieces.join(''), done.log);
      assert.match(done.log, new RegExp(`template ${id} is ready`));
      assert.equal((await Template.getBuild(id, build.id, srv.opts)).log, done.log);
      assert.equal((await Template.get(id, srv.opts)).id, id);
      const catalog = await Template.list(srv.opts);
      assert.ok(catalog.some((t) => t.id === id) && catalog.some((t) => t.id === 'base'), JSON.stringify(catalog.map((t) => t.id)));
      assert.ok(catalog.find((t) => t.id === 'base').sizes.length > 0);
      const builds = await Template.builds(id, srv.opts);
      assert.deepEqual(builds.map((b) => b.id), [build.id]);
      assert.equal(builds[0].state, 'ready');
      const sb = await Sandbox.create({ ...srv.opts, template: id, size: 'xs' });
      try {
        assert.equal(await sb.files.read('/opt/hi.txt'), 'hi\n');
        await assert.rejects(Template.delete(id, srv.opts), ConflictError);
      } finally {
        await sb.kill();
      }
    } finally {
      assert.equal((await Template.delete(id, srv.opts)).id, id);
    }
    await assert.rejects(Template.get(id, srv.opts), NotFoundError);
  });

  it('a failing step makes the build failed, with its output in the log', async () => {
    const id = templateId();
    const build = await Template.build({ id, steps: [{ run: 'echo going-wrong; exit 3' }] }, srv.opts);
    try {
      const done = await build.wait({ timeoutMs: 120_000 });
      assert.equal(done.state, 'failed');
      assert.match(done.error, /exited with 3/);
      assert.match(done.log, /going-wrong/);
      assert.equal(done.steps[0].state, 'failed');
      await assert.rejects(build.wait({ check: true }), (e) => e instanceof TemplateBuildError && e.build.id === build.id);
    } finally {
      await Template.delete(id, srv.opts);
    }
  });

  it('refuses a bad spec and unknown templates', async () => {
    await assert.rejects(Template.build({ id: 'Not Valid' }, srv.opts), InvalidRequestError);
    await assert.rejects(Template.delete('base', srv.opts), ConflictError);
    await assert.rejects(Template.delete(templateId(), srv.opts), NotFoundError);
    await assert.rejects(Template.builds(templateId(), srv.opts), NotFoundError);
  });
});
