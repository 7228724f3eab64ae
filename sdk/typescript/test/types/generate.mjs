// Starts a test server (CELLA_BIN), fetches its OpenAPI document and writes the API's types
// into test/types/openapi.generated.ts (see scripts/openapi-types.mjs).
import { spawnSync } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { startServer } from '../server.js';

const here = (p) => fileURLToPath(new URL(p, import.meta.url));
const srv = await startServer();
try {
  const r = await fetch(`${srv.url}/api/v1/openapi.json`);
  if (!r.ok) throw new Error(`GET /api/v1/openapi.json: ${r.status}`);
  writeFileSync(here('./openapi.json'), await r.text());
} finally {
  await srv.stop();
}
const gen = spawnSync(process.execPath, [here('../../scripts/openapi-types.mjs'), here('./openapi.json'), here('./openapi.generated.ts')], {
  stdio: 'inherit',
});
process.exit(gen.status ?? 1);
