// A CommonJS user of the package: `require` resolves to dist/cjs and its declarations.
import sdk = require('@cella/sdk');

export async function main(): Promise<string> {
  const sb = await sdk.Sandbox.create({ size: 'xs' });
  const r: sdk.CommandResult = await sb.commands.run('uname');
  await sb.kill();
  return r.stdout;
}
