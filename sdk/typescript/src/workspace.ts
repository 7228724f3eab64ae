// The workspace: its settings, wallet, ledger and usage (an admin key's, or the operator's).

import { request } from './http.js';
import { camelize, snakeize, toDate } from './convert.js';
import { configOf, listAll } from './resources.js';
import type { ConnectionConfig } from './http.js';
import { checkOptions } from './options.js';
import type {
  ConnectionOptions,
  LedgerEntry,
  Member,
  Role,
  WorkspaceCreateOptions,
  WorkspaceStorage,
  UsageReport,
  Wallet,
  WorkspaceInfo,
  WorkspaceOptions,
  WorkspaceUpdate,
} from './types.js';

const enc = encodeURIComponent;

function workspaceInfo(raw: unknown): WorkspaceInfo {
  return camelize<WorkspaceInfo>(raw);
}

function ledgerEntry(raw: unknown): LedgerEntry {
  const e = camelize<LedgerEntry>(raw);
  e.at = toDate(e.at) as Date;
  return e;
}

function day(v: string | Date | undefined): string | undefined {
  return v instanceof Date ? v.toISOString() : v;
}

/** The key's own workspace (the first `GET /workspaces` lists), unless `workspaceId` names one. */
export async function workspaceId(config: ConnectionConfig, opts: WorkspaceOptions): Promise<string> {
  if (opts.workspaceId) return opts.workspaceId;
  const r = await request(config, 'GET', '/workspaces', { query: { limit: 1 }, signal: opts.signal });
  const first = Array.isArray(r.data) ? r.data[0] : null;
  if (!first?.id) throw new TypeError('Workspace: this key sees no workspace; pass workspaceId');
  return first.id as string;
}

/** Workspaces: settings (e.g. `tasksEnabled`), wallet, ledger and usage. Scope `admin`. */
export class Workspace {
  /** The workspaces the key sees, oldest first (a workspace's admin key: its own). */
  static async list(opts: ConnectionOptions & { signal?: AbortSignal } = {}): Promise<WorkspaceInfo[]> {
    const data = await listAll(configOf(opts), '/workspaces', {}, opts.signal);
    return data.map(workspaceInfo);
  }

  /** One workspace (default: the key's own). */
  static async get(opts: WorkspaceOptions = {}): Promise<WorkspaceInfo> {
    const config = configOf(opts);
    const id = await workspaceId(config, opts);
    const r = await request(config, 'GET', `/workspaces/${enc(id)}`, { signal: opts.signal });
    return workspaceInfo(r.data);
  }

  /**
   * Changes a workspace's name, plan or settings (camelCase; the settings not named keep their
   * values), e.g. `Workspace.update({settings: {tasksEnabled: true}})`; returns it.
   */
  static async update(update: WorkspaceUpdate, opts: WorkspaceOptions = {}): Promise<WorkspaceInfo> {
    const config = configOf(opts);
    const id = await workspaceId(config, opts);
    const body: Record<string, unknown> = snakeize({ name: update.name, plan: update.plan });
    if (update.settings) body.settings = snakeize(update.settings);
    const r = await request(config, 'PATCH', `/workspaces/${enc(id)}`, { json: body, signal: opts.signal });
    return workspaceInfo(r.data);
  }

  /** The wallet: `balance`, `reserved` (held for what runs), `available`, decimal strings. */
  static async wallet(opts: WorkspaceOptions = {}): Promise<Wallet> {
    const config = configOf(opts);
    const id = await workspaceId(config, opts);
    const r = await request(config, 'GET', `/workspaces/${enc(id)}/wallet`, { signal: opts.signal });
    return camelize<Wallet>(r.data);
  }

  /** The ledger, newest first, every page followed (`limit`: the page size). */
  static async ledger(opts: WorkspaceOptions & { limit?: number } = {}): Promise<LedgerEntry[]> {
    const config = configOf(opts);
    const id = await workspaceId(config, opts);
    const data = await listAll(config, `/workspaces/${enc(id)}/ledger`, { limit: opts.limit }, opts.signal);
    return data.map(ledgerEntry);
  }

  /**
   * Usage per UTC day in `[from, to)` (default: the last 30 days) with totals: compute (on
   * the day it settled) and model requests. `from`/`to`: Dates, RFC 3339 or `YYYY-MM-DD`.
   */
  static async usage(opts: WorkspaceOptions & { from?: string | Date; to?: string | Date } = {}): Promise<UsageReport> {
    const config = configOf(opts);
    const id = await workspaceId(config, opts);
    const r = await request(config, 'GET', `/workspaces/${enc(id)}/usage`, {
      query: { from: day(opts.from), to: day(opts.to) },
      signal: opts.signal,
    });
    const report = camelize<UsageReport>(r.data);
    report.from = toDate(report.from) as Date;
    report.to = toDate(report.to) as Date;
    return report;
  }

  /**
   * Credits the wallet (the operator only): `amount` a decimal string, `reference` a note
   * kept with the entry (an invoice number). Returns the ledger entry.
   */
  static async addCredits(amount: string, reference: string, opts: WorkspaceOptions = {}): Promise<LedgerEntry> {
    const config = configOf(opts);
    const id = await workspaceId(config, opts);
    const r = await request(config, 'POST', `/workspaces/${enc(id)}/wallet/credits`, {
      json: { amount, reference },
      signal: opts.signal,
    });
    return ledgerEntry(r.data);
  }

  /** Makes a workspace (the operator only). */
  static async create(opts: WorkspaceCreateOptions): Promise<WorkspaceInfo> {
    const o = checkOptions(opts, ['name', 'kind', 'plan'], 'Workspace.create');
    const r = await request(configOf(o), 'POST', '/workspaces', {
      json: snakeize({ name: o.name, kind: o.kind, plan: o.plan }),
      signal: o.signal,
    });
    return workspaceInfo(r.data);
  }

  /** What the workspace stores against its storage quota, by kind (bytes). */
  static async storage(opts: WorkspaceOptions = {}): Promise<WorkspaceStorage> {
    const config = configOf(opts);
    const id = await workspaceId(config, opts);
    const r = await request(config, 'GET', `/workspaces/${enc(id)}/storage`, { signal: opts.signal });
    return camelize<WorkspaceStorage>(r.data);
  }

  /** The workspace's members, in the order they joined. */
  static async members(opts: WorkspaceOptions = {}): Promise<Member[]> {
    const config = configOf(opts);
    const id = await workspaceId(config, opts);
    const data = await listAll(config, `/workspaces/${enc(id)}/members`, {}, opts.signal);
    return data.map((raw) => camelize<Member>(raw));
  }

  /** Adds an existing user (by email) to an organization workspace with a role. */
  static async addMember(email: string, role: Role, opts: WorkspaceOptions = {}): Promise<Member> {
    const config = configOf(opts);
    const id = await workspaceId(config, opts);
    const r = await request(config, 'POST', `/workspaces/${enc(id)}/members`, { json: { email, role }, signal: opts.signal });
    return camelize<Member>(r.data);
  }

  /** Changes a member's role. */
  static async updateMember(userId: string, role: Role, opts: WorkspaceOptions = {}): Promise<Member> {
    const config = configOf(opts);
    const id = await workspaceId(config, opts);
    const r = await request(config, 'PATCH', `/workspaces/${enc(id)}/members/${enc(userId)}`, { json: { role }, signal: opts.signal });
    return camelize<Member>(r.data);
  }

  /** Removes a member (ConflictError for the last owner); returns them as they were. */
  static async removeMember(userId: string, opts: WorkspaceOptions = {}): Promise<Member> {
    const config = configOf(opts);
    const id = await workspaceId(config, opts);
    const r = await request(config, 'DELETE', `/workspaces/${enc(id)}/members/${enc(userId)}`, { signal: opts.signal });
    return camelize<Member>(r.data);
  }
}
