// The code interpreter against a real server: runCode (Python, JavaScript, contexts, errors,
// rich outputs, timeouts) and sandbox.code's contexts and kernels; an error path for each.

import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import {
  Sandbox,
  Execution,
  NotFoundError,
  InvalidRequestError,
  UnknownLanguageError,
  SandboxNotRunningError,
} from '@cella/sdk';
import { startServer } from './server.js';

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

describe('runCode', () => {
  it('runs Python and returns the last expression, stdout and stderr', async () => {
    const ex = await sb.runCode('import sys\nprint("to stdout")\nprint("to stderr", file=sys.stderr)\n6 * 7');
    assert.ok(ex instanceof Execution);
    assert.equal(ex.ok, true);
    assert.equal(ex.language, 'python');
    assert.equal(ex.stdout, 'to stdout\n');
    assert.equal(ex.stderr, 'to stderr\n');
    assert.equal(ex.result, '42');
    assert.equal(ex.text, '42');
    assert.equal(ex.error, null);
    assert.deepEqual(ex.outputs, []);
    assert.equal(ex.restarted, false);
    assert.equal(JSON.parse(JSON.stringify(ex)).result, '42');
  });

  it('keeps state in a context and apart between contexts', async () => {
    await sb.runCode('x = 10', { context: 'one' });
    assert.equal((await sb.runCode('x + 1', { context: 'one' })).result, '11');
    const other = await sb.runCode('x', { context: 'two' });
    assert.equal(other.ok, false);
    assert.equal(other.error.name, 'NameError');
  });

  it('reports an exception with its name, value and traceback', async () => {
    const ex = await sb.runCode('def f():\n    raise ValueError("bad value")\nf()');
    assert.equal(ex.ok, false);
    assert.equal(ex.error.name, 'ValueError');
    assert.equal(ex.error.value, 'bad value');
    assert.match(ex.error.traceback, /Traceback[\s\S]*ValueError: bad value/);
  });

  it('returns rich outputs (a matplotlib figure as PNG)', async () => {
    const ex = await sb.runCode(
      'import matplotlib\nmatplotlib.use("Agg")\nimport matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()',
    );
    assert.equal(ex.ok, true, JSON.stringify(ex.error));
    const png = ex.outputs.find((o) => o.mime === 'image/png');
    assert.ok(png, JSON.stringify(ex.outputs.map((o) => o.mime)));
    assert.deepEqual([...Buffer.from(png.data, 'base64').subarray(0, 4)], [0x89, 0x50, 0x4e, 0x47]);
  });

  it('runs pandas', async () => {
    const ex = await sb.runCode('import pandas as pd\ndf = pd.DataFrame({"a": [1, 2, 3]})\nint(df["a"].sum())');
    assert.equal(ex.ok, true, JSON.stringify(ex.error));
    assert.equal(ex.result, '6');
  });

  it('runs JavaScript', async () => {
    await sb.runCode('const seen = [1, 2]', { language: 'javascript' });
    const ex = await sb.runCode('console.log("js out"); seen.length * 21', { language: 'javascript' });
    assert.equal(ex.ok, true, JSON.stringify(ex.error));
    assert.equal(ex.language, 'javascript');
    assert.equal(ex.stdout, 'js out\n');
    assert.equal(ex.result, '42');
  });

  it('interrupts a cell at its timeout and keeps the context', async () => {
    await sb.runCode('kept = "yes"', { context: 'slow' });
    const started = Date.now();
    const ex = await sb.runCode('import time\ntime.sleep(30)', { context: 'slow', timeout: 1 });
    assert.ok(Date.now() - started < 15_000);
    assert.equal(ex.ok, false);
    assert.ok(ex.error, 'a timed-out cell reports an error');
    const after = await sb.runCode('kept', { context: 'slow' });
    assert.equal(after.result, "'yes'");
  });

  it('errors: an unknown language, a bad context name, a bad timeout, a paused sandbox, an unknown sandbox', async () => {
    await assert.rejects(sb.runCode('1', { language: 'cobol' }), (e) => {
      assert.ok(e instanceof UnknownLanguageError);
      assert.ok(e instanceof InvalidRequestError);
      assert.equal(e.code, 'UNKNOWN_LANGUAGE');
      assert.equal(e.field, 'language');
      assert.equal(e.status, 400);
      return true;
    });
    await assert.rejects(sb.runCode('1', { context: 'bad name!' }), (e) => e instanceof InvalidRequestError && e.field === 'context');
    await assert.rejects(sb.runCode('1', { timeout: -1 }), (e) => e instanceof InvalidRequestError && e.field === 'timeout');
    await assert.rejects(paused.runCode('1'), SandboxNotRunningError);
    await assert.rejects(new Sandbox({ id: 'sbnosuchsandbox00000' }, srv.opts).runCode('1'), NotFoundError);
  });
});

describe('sandbox.code', () => {
  it('creates, lists and resets contexts; reports and resets kernels', async () => {
    const made = await sb.code.createContext({ context: 'ctx-a' });
    assert.deepEqual(made, { name: 'ctx-a', language: 'python', created: true });
    assert.equal((await sb.code.createContext({ context: 'ctx-a' })).created, false);
    await sb.code.run('v = 5', { context: 'ctx-a' });
    const names = (await sb.code.contexts()).map((c) => c.name);
    assert.ok(names.includes('ctx-a'), names.join(','));
    const reset = await sb.code.resetContext('ctx-a');
    assert.deepEqual(reset, { name: 'ctx-a', language: 'python', existed: true });
    assert.equal((await sb.code.run('v', { context: 'ctx-a' })).error.name, 'NameError');

    const state = await sb.code.state();
    const py = state.kernels.find((k) => k.language === 'python');
    assert.ok(py && py.running);
    const js = await sb.code.createContext({ language: 'javascript', context: 'j' });
    assert.equal(js.language, 'javascript');
    assert.deepEqual((await sb.code.contexts({ language: 'javascript' })).map((c) => c.name).includes('j'), true);

    await sb.code.run('w = 1', { context: 'gone' });
    const after = await sb.code.reset({ language: 'python' });
    assert.ok(Array.isArray(after.kernels));
    assert.equal((await sb.code.run('w', { context: 'gone' })).ok, false);
  });

  it('errors: unknown languages, bad context names, a paused sandbox', async () => {
    await assert.rejects(sb.code.createContext({ language: 'cobol' }), UnknownLanguageError);
    await assert.rejects(sb.code.createContext({ context: '' }), InvalidRequestError);
    await assert.rejects(sb.code.contexts({ language: 'cobol' }), UnknownLanguageError);
    await assert.rejects(sb.code.resetContext('bad name!'), InvalidRequestError);
    await assert.rejects(sb.code.reset({ language: 'cobol' }), UnknownLanguageError);
    await assert.rejects(paused.code.state(), SandboxNotRunningError);
    await assert.rejects(paused.code.contexts(), SandboxNotRunningError);
  });
});
