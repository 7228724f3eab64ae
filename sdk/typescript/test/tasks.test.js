// Task runs against a real server with a plain git forge over local bare repositories and
// command agents (shell lines, no model): start a run, follow its events to `stopped`, find
// its branch with the agent's commit in the repository; list, get, the live log, cancel; and
// the workspace's settings, wallet, ledger and usage the runs are billed to.

import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  Task,
  TaskRun,
  Workspace,
  isTerminal,
  GoneError,
  NotFoundError,
  PermissionDeniedError,
  InvalidRequestError,
} from '@cella/sdk';
import { adminCall, startServer } from './server.js';

const GIT_ID = 'git -c user.name=agent -c user.email=agent@example.org';

let srv;
let repos;
let bare;

function git(cwd, ...args) {
  return execFileSync('git', args, { cwd, encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
}

/** A bare repository `root/<name>.git` with one commit on `main`. */
function makeRepo(root, name) {
  const work = mkdtempSync(join(tmpdir(), 'cella-ts-work-'));
  git(work, 'init', '-q', '-b', 'main');
  writeFileSync(join(work, 'README.md'), '# web\n');
  git(work, 'add', '-A');
  git(work, '-c', 'user.name=test', '-c', 'user.email=test@example.org', 'commit', '-q', '-m', 'the first commit');
  const path = join(root, `${name}.git`);
  mkdirSync(join(path, '..'), { recursive: true });
  git(root, 'clone', '-q', '--bare', work, path);
  rmSync(work, { recursive: true, force: true });
  return path;
}

before(async () => {
  repos = mkdtempSync(join(tmpdir(), 'cella-ts-repos-'));
  bare = makeRepo(repos, 'acme/web');
  const agent = (name, script) =>
    `[[agents]]\nname = "${name}"\nkind = "command"\ncommand = ["bash", "-c", '''${script}''']\n`;
  srv = await startServer({
    config:
      '[tasks]\nrunners = 2\nheartbeat_interval_sec = 1\ngrace_sec = 2\n\n' +
      `[[forges]]\nname = "git"\nkind = "git"\nurl_template = "${repos}/{repository}.git"\n\n` +
      agent('script', `echo writing the file && echo "done by the agent" > AGENT.md && ${GIT_ID} add -A && ${GIT_ID} commit -qm "Agent work"`) +
      agent('ticker', 'while true; do echo tick; sleep 1; done'),
  });
});

after(async () => {
  await srv?.stop();
  if (repos) rmSync(repos, { recursive: true, force: true });
});

describe('workspace settings, wallet, ledger', () => {
  it('task runs are refused until the workspace turns them on', async () => {
    await assert.rejects(Task.start({ ...srv.opts, repository: 'acme/web', task: 'x' }), (e) => {
      assert.ok(e instanceof PermissionDeniedError, String(e));
      assert.equal(e.status, 403);
      return true;
    });
    assert.deepEqual(await Task.list(srv.opts), [], 'a refused start queued nothing');
  });

  it('updates settings, credits the wallet and reads it and the ledger', async () => {
    const [first] = await Workspace.list(srv.opts);
    const ws = await Workspace.update({ settings: { tasksEnabled: true, computeRate: '0.000100' } }, srv.opts);
    assert.equal(ws.id, first.id);
    assert.equal(ws.settings.tasksEnabled, true);
    assert.equal(ws.settings.computeRate, '0.000100');
    assert.ok(ws.createdAt instanceof Date);
    assert.equal((await Workspace.get({ ...srv.opts, workspaceId: ws.id })).settings.tasksEnabled, true);

    const before = await Workspace.wallet(srv.opts);
    const entry = await Workspace.addCredits('25.000000', 'test credit', srv.opts);
    assert.equal(entry.kind, 'credit');
    assert.equal(entry.amount, '25.000000');
    assert.equal(entry.reference, 'test credit');
    assert.ok(entry.at instanceof Date);
    const wallet = await Workspace.wallet(srv.opts);
    assert.equal(Number(wallet.balance) - Number(before.balance), 25);
    assert.equal(wallet.currency, 'USD');
    assert.ok('available' in wallet && 'reserved' in wallet);
    const ledger = await Workspace.ledger(srv.opts);
    assert.equal(ledger[0].id, entry.id, 'newest first');
    assert.equal(ledger[0].balanceAfter, wallet.balance);

    await assert.rejects(Workspace.addCredits('-1', 'no', srv.opts), InvalidRequestError);
    await assert.rejects(Workspace.wallet({ ...srv.opts, workspaceId: 'wsnothere' }), NotFoundError);
  });
});

describe('Task', () => {
  let run;

  it('starts a run and follows its events to stopped; the branch has the agent\'s commit', async () => {
    run = await Task.start({ ...srv.opts, repository: 'acme/web', baseBranch: 'main', task: 'write AGENT.md', metadata: { ticket: 'T-1' } });
    assert.ok(run instanceof TaskRun);
    assert.equal(run.state, 'queued');
    assert.equal(run.info.repository, 'acme/web');
    assert.equal(run.info.baseBranch, 'main');
    assert.equal(run.info.agent, 'script');
    assert.equal(run.info.metadata.ticket, 'T-1');
    assert.ok(run.info.queuedAt instanceof Date);
    assert.ok(run.branch.endsWith(run.id), run.branch);

    const states = [];
    for await (const ev of run.events()) {
      if (ev.type === 'state') {
        states.push(ev.state);
        assert.ok(ev.data.at instanceof Date);
      }
    }
    assert.equal(states.at(-1), 'stopped', `states: ${states}\n${srv.log().slice(-3000)}`);
    assert.ok(states.includes('running') || states.length === 1, `states: ${states}`);

    const info = await run.refresh();
    assert.equal(info.state, 'stopped');
    assert.equal(info.stopReason, 'agent_exit');
    assert.equal(info.failureReason, null);
    assert.ok(info.endedAt instanceof Date);
    assert.ok(isTerminal(info.state));
    assert.equal(git(bare, 'show', `${info.branch}:AGENT.md`), 'done by the agent\n');
    assert.match(git(bare, 'log', '--format=%s', `main..${info.branch}`), /Agent work/);
    assert.equal(git(bare, 'show', 'main:README.md'), '# web\n', 'main is left alone');
  });

  it('gets and lists runs, with filters', async () => {
    const got = await Task.get(run.id, srv.opts);
    assert.equal(got.id, run.id);
    assert.equal(got.state, 'stopped');
    const all = await Task.list(srv.opts);
    assert.ok(all.some((t) => t.id === run.id));
    assert.deepEqual((await Task.list({ ...srv.opts, state: 'stopped' })).map((t) => t.id), [run.id]);
    assert.deepEqual(await Task.list({ ...srv.opts, repository: 'acme/other' }), []);
    await assert.rejects(Task.get('tsknothere', srv.opts), NotFoundError);
    await assert.rejects(Task.start({ ...srv.opts, repository: 'acme/missing', task: 'x' }), NotFoundError);
    await assert.rejects(Task.list({ ...srv.opts, sate: 'running' }), TypeError);
  });

  it('the run was billed: a compute entry in the ledger and the usage report', async () => {
    let compute;
    for (let i = 0; i < 50 && !compute; i++) {
      compute = (await Workspace.ledger(srv.opts)).find((e) => e.kind === 'compute' && e.taskId === run.id);
      if (!compute) await new Promise((r) => setTimeout(r, 200));
    }
    assert.ok(compute, 'no compute entry for the run');
    assert.ok(compute.computeSec >= 60, 'the 60-second minimum');
    assert.ok(Number(compute.amount) < 0);
    const usage = await Workspace.usage({ ...srv.opts, from: new Date(Date.now() - 86_400_000) });
    assert.ok(usage.from instanceof Date && usage.to instanceof Date);
    assert.ok(usage.totals.computeSec >= 60, JSON.stringify(usage.totals));
    assert.ok(usage.days.length >= 1 && /^\d{4}-\d{2}-\d{2}$/.test(usage.days[0].date));
    await assert.rejects(Workspace.usage({ ...srv.opts, from: 'not a date' }), InvalidRequestError);
  });

  it('streams the live log, cancels, and the log is gone afterwards', async () => {
    const ticker = await Task.start({ ...srv.opts, repository: 'acme/web', task: 'tick', agent: 'ticker' });
    let text = '';
    for await (const chunk of ticker.log()) {
      assert.equal(chunk.stream, 'stdout');
      text += chunk.text;
      if (text.includes('tick')) break;
    }
    assert.match(text, /tick/);
    const cancelled = await ticker.cancel();
    assert.ok(['cancelled', 'running', 'provisioning'].includes(cancelled.state), cancelled.state);
    const ended = await ticker.wait();
    assert.equal(ended.state, 'cancelled', JSON.stringify(ended));
    assert.equal(ended.stopReason, 'cancelled');
    await assert.rejects(async () => {
      for await (const _ of Task.log(ticker.id, srv.opts)) {
        // nothing: the run has ended
      }
    }, (e) => e instanceof GoneError && e.status === 410);
    // Events of an ended run: its final state, then the stream ends.
    const evs = [];
    for await (const ev of Task.events(ticker.id, srv.opts)) evs.push(ev);
    assert.equal(evs.at(-1).state, 'cancelled');
    // Cancelling again changes nothing.
    assert.equal((await Task.cancel(ticker.id, srv.opts)).state, 'cancelled');
  });

  it('a key with tasks:read only cannot start a run', async () => {
    const keys = await adminCall(srv, 'GET', '/api-keys');
    const key = await adminCall(srv, 'POST', '/api-keys', { workspace_id: keys[0].workspace_id, name: 'ro', scopes: ['tasks:read'] });
    const ro = { ...srv.opts, apiKey: key.key };
    assert.ok((await Task.list(ro)).length >= 2);
    await assert.rejects(Task.start({ ...ro, repository: 'acme/web', task: 'x' }), (e) => e instanceof PermissionDeniedError && e.status === 403);
    await assert.rejects(Workspace.wallet(ro), PermissionDeniedError);
  });
});
