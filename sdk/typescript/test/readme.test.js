// This README's examples, as printed (importing the built package by its name): the quick start as one module, the other js blocks in
// order as a second module (one session), run by node against a real server; they must succeed
// and leave no sandbox running.

import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Sandbox } from '@cella/sdk';
import { startServer } from './server.js';

const README = fileURLToPath(new URL('../README.md', import.meta.url));
// The built package, as a user's node_modules/@cella/sdk would hold it.
const SDK_DIR = dirname(dirname(fileURLToPath(import.meta.url)));

let srv;

before(async () => {
  srv = await startServer();
});

after(async () => {
  await srv?.stop();
});

function blocks() {
  const text = readFileSync(README, 'utf8');
  return [...text.matchAll(/^```js\n([\s\S]*?)^```/gm)].map((m) => m[1]);
}

function runModule(dir, name, code) {
  const file = join(dir, name);
  writeFileSync(file, code);
  return spawnSync(process.execPath, [file], {
    cwd: dir,
    env: { ...process.env, CELLA_SERVER: srv.url, CELLA_API_KEY: srv.key },
    encoding: 'utf8',
    timeout: 300_000,
  });
}

describe('README', () => {
  it('runs every example as printed and leaves no sandbox running', async () => {
    const found = blocks();
    assert.ok(found.length >= 6, 'the README examples were not found');
    const dir = mkdtempSync(join(tmpdir(), 'cella-readme-'));
    mkdirSync(join(dir, 'node_modules', '@cella'), { recursive: true });
    symlinkSync(SDK_DIR, join(dir, 'node_modules', '@cella', 'sdk'), 'dir');
    const quick = runModule(dir, 'quick.mjs', found[0]);
    assert.equal(quick.status, 0, `quick start failed:\n${quick.stdout}\n${quick.stderr}`);
    assert.match(quick.stdout, /Linux/);
    const session = runModule(dir, 'session.mjs', found.slice(1).join('\n'));
    assert.equal(session.status, 0, `the session failed:\n${session.stdout}\n${session.stderr}`);
    assert.match(session.stdout, /tick 3/);
    assert.match(session.stdout, /^input$/m);
    assert.match(session.stdout, /^100$/m);
    assert.deepEqual(await Sandbox.list(srv.opts), [], 'the examples left sandboxes running');
  });
});
