// Writes the README's `ts` blocks (the examples CI does not run: they need a configured forge
// and agent, or a WebSocket flag) as TypeScript modules beside this script, for tsc to check
// with the rest of test/types: each block's imports stay at the top, its code becomes the body
// of an async function that is handed a running sandbox as `sb`.
import { readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

const here = (p) => fileURLToPath(new URL(p, import.meta.url));
for (const f of readdirSync(here('.'))) if (/^readme-\d+\.generated\.ts$/.test(f)) rmSync(here(`./${f}`));
const text = readFileSync(here('../../README.md'), 'utf8');
const blocks = [...text.matchAll(/^```ts\n([\s\S]*?)^```/gm)].map((m) => m[1]);
blocks.forEach((code, i) => {
  const lines = code.split('\n');
  const imports = lines.filter((l) => /^import /.test(l));
  const body = lines.filter((l) => !/^import /.test(l));
  const out = [
    `// README.md's ts block ${i + 1}, written by readme-blocks.mjs.`,
    "import type { Sandbox as ReadmeSandbox } from '@cella/sdk';",
    ...imports,
    '',
    '// What the examples use of Node (the check has no @types/node).',
    'declare const process: { stdout: { write(data: string | Uint8Array): boolean } };',
    '',
    `export async function readmeBlock${i + 1}(sb: ReadmeSandbox): Promise<void> {`,
    ...body.map((l) => (l ? `  ${l}` : l)),
    '  void sb;',
    '}',
    '',
  ];
  writeFileSync(here(`./readme-${i + 1}.generated.ts`), out.join('\n'));
});
console.log(`readme-blocks: ${blocks.length} ts block(s) written`);
