// Last-resort cleanup when a test process dies before its after() hooks ran: destroys every
// sandbox the server still has (sandboxes outlive their server), stops the server, removes its
// data directory. Run synchronously from the dying process: node cleanup.js URL KEY PID DIR.

import { rmSync } from 'node:fs';

const [url, key, pidText, dir] = process.argv.slice(2);
const pid = Number(pidText);
const auth = { authorization: `Bearer ${key}` };
const alive = () => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};

try {
  const r = await fetch(`${url}/api/v1/sandboxes?limit=1000`, { headers: auth, signal: AbortSignal.timeout(5000) });
  if (r.ok) {
    for (const sb of (await r.json()).data) {
      if (sb.state === 'destroyed') continue;
      await fetch(`${url}/api/v1/sandboxes/${sb.id}`, { method: 'DELETE', headers: auth, signal: AbortSignal.timeout(10000) })
        .then((res) => res.arrayBuffer())
        .catch(() => {});
    }
  }
} catch {
  // the server is gone: nothing more to ask it
}
if (alive()) {
  process.kill(pid, 'SIGTERM');
  for (let i = 0; i < 100 && alive(); i++) await new Promise((r) => setTimeout(r, 100));
  if (alive()) process.kill(pid, 'SIGKILL');
}
rmSync(dir, { recursive: true, force: true });
