// Runs examples/typescript/csv_pandas.mjs as a user would, against a server this script starts:
// the example is copied beside a node_modules/@cella/sdk link to this SDK (no npm install),
// and gets CELLA_SERVER and CELLA_API_KEY. Checks what it prints; exits non-zero on failure.

import { spawn } from 'node:child_process';
import { copyFileSync, mkdirSync, mkdtempSync, rmSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { startServer } from './server.js';

const sdkDir = dirname(dirname(fileURLToPath(import.meta.url)));
const example = join(sdkDir, '..', '..', 'examples', 'typescript', 'csv_pandas.mjs');

const work = mkdtempSync(join(tmpdir(), 'cella-example-'));
mkdirSync(join(work, 'node_modules', '@cella'), { recursive: true });
symlinkSync(sdkDir, join(work, 'node_modules', '@cella', 'sdk'), 'dir');
copyFileSync(example, join(work, 'csv_pandas.mjs'));
process.on('exit', () => rmSync(work, { recursive: true, force: true }));

const srv = await startServer();
let failed = null;
let output = '';
try {
  const code = await new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ['csv_pandas.mjs'], {
      cwd: work,
      env: { ...process.env, CELLA_SERVER: srv.url, CELLA_API_KEY: srv.key },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    const timer = setTimeout(() => child.kill('SIGKILL'), 120_000);
    child.stdout.on('data', (d) => {
      output += d;
      process.stdout.write(d);
    });
    child.stderr.on('data', (d) => process.stderr.write(d));
    child.on('error', reject);
    child.on('exit', (c, sig) => {
      clearTimeout(timer);
      resolve(c ?? sig);
    });
  });
  if (code !== 0) failed = `the example exited with ${code}`;
  else {
    // Revenue: north 30 + 30 + 20, east 48 + 20, south 17.5 + 47.5.
    const expect = [
      /pandas says: 7 rows, 3 regions; total revenue 213\.0/,
      /^region,orders,units,revenue$/m,
      /^north,3,23,80\.0$/m,
      /^east,2,22,68\.0$/m,
      /^south,2,12,65\.0$/m,
      /destroyed/,
    ];
    for (const re of expect) if (!re.test(output)) failed = `the example's output does not match ${re}`;
    const { Sandbox } = await import('@cella/sdk');
    if ((await Sandbox.list({ ...srv.opts, state: 'running' })).length !== 0) failed = 'the example left a sandbox running';
  }
} finally {
  const leftovers = await srv.destroyAll().catch(() => 0);
  await srv.stop();
  rmSync(work, { recursive: true, force: true });
  if (leftovers && !failed) failed = `${leftovers} sandbox(es) were left alive`;
}
if (failed) {
  console.error(`example csv_pandas: FAILED: ${failed}`);
  process.exit(1);
}
console.log('example csv_pandas: ok');
