// The public API as a TypeScript user writes it: compiled (never run) by tsc with the built
// package's declarations, so an overload, an option or a return type that changes fails CI.
import {
  Sandbox,
  Task,
  TaskRun,
  Workspace,
  Template,
  Artifact,
  NotFoundError,
  CellaError,
  type CommandHandle,
  type CommandResult,
  type EntryInfo,
  type SandboxInfo,
  type TaskEvent,
  type TaskInfo,
  type Wallet,
  type LedgerEntry,
  type UsageReport,
} from '@cella/sdk';

export async function usage(): Promise<void> {
  const sb: Sandbox = await Sandbox.create({ template: 'base', size: 'xs', timeoutMs: 60_000, envs: { A: 'b' } });
  const alsoSb: Sandbox = await Sandbox.create('base', { metadata: { team: 'x' } });
  const info: SandboxInfo = sb.info;
  const created: Date = info.createdAt;
  const listed: SandboxInfo[] = await Sandbox.list({ state: 'running' });
  for await (const s of Sandbox.list()) s.id satisfies string;

  const r: CommandResult = await sb.commands.run('ls', { cwd: '/tmp' });
  // A callback may return anything (process.stdout.write returns a boolean).
  const write = (text: string): boolean => text.length > 0;
  await sb.commands.run('ls', { onStdout: write, onStderr: write });
  const h: CommandHandle = await sb.commands.run('sleep 1', { background: true });
  for await (const chunk of h) chunk.type satisfies 'stdout' | 'stderr';
  const text: string = await sb.files.read('/etc/hostname');
  const bytes: Uint8Array = await sb.files.read('/etc/hostname', { format: 'bytes' });
  const stream: ReadableStream<Uint8Array> = await sb.files.read('/etc/hostname', { format: 'stream' });
  const entry: EntryInfo = await sb.files.write('/tmp/x', new Uint8Array(3));
  const entries: EntryInfo[] = await sb.files.write([{ path: '/tmp/y', data: 'y' }]);
  const ex = await sb.runCode('1 + 1');
  const png = ex.outputs.find((o) => o.mime === 'image/png')?.data;
  const runResult = await Sandbox.run('echo hi', { artifacts: ['*.txt'] });
  const artifactText: string = await Artifact.download(runResult.artifacts[0]!, { format: 'text' });
  const build = await Template.build({ id: 'tpl', steps: [{ run: 'true' }] });
  (await build.wait({ check: true })).state satisfies 'queued' | 'building' | 'ready' | 'failed';

  const run: TaskRun = await Task.start({ repository: 'acme/web', task: 'fix it', baseBranch: 'main' });
  for await (const ev of run.events()) ev satisfies TaskEvent;
  for await (const chunk of run.log()) chunk.text satisfies string;
  const ended: TaskInfo = await run.wait({ onEvent: (e) => void e.state });
  const tasks: TaskInfo[] = await Task.list({ state: 'running' });
  const wallet: Wallet = await Workspace.wallet();
  const ledger: LedgerEntry[] = await Workspace.ledger({ limit: 10 });
  const report: UsageReport = await Workspace.usage({ from: new Date(), to: '2026-12-01' });
  await Workspace.update({ settings: { tasksEnabled: true } });

  const term = await sb.pty.create({ cols: 100, command: 'ls', onData: (b: Uint8Array) => void b });
  term.sendInput('exit\n');
  term.resize({ cols: 80, rows: 24 });
  const exitCode: number | null = await term.wait();
  for await (const b of term) b satisfies Uint8Array;

  try {
    await sb.kill();
  } catch (e) {
    if (e instanceof NotFoundError) e.code satisfies string;
    if (e instanceof CellaError) e.status satisfies number | null;
  }

  // @ts-expect-error: an unknown option
  await Sandbox.create({ sise: 'xs' });
  // @ts-expect-error: a task run needs a repository
  await Task.start({ task: 'x' });
  // @ts-expect-error: a read's format is one of four
  await sb.files.read('/x', { format: 'json' });

  void [exitCode, alsoSb, created, listed, r, text, bytes, stream, entry, entries, png, artifactText, ended, tasks, wallet, ledger, report];
}
