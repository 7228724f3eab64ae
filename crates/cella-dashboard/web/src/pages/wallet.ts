// Wallet: the balance, what running work holds (reserved) and what is left (available); a
// chart of the last 30 days' compute and model cost (an inline SVG drawn here from
// `GET /api/v1/workspaces/{id}/usage`, with the same figures as a table for screen readers and
// anyone who prefers one); and the ledger, newest first, a page at a time. Reading money takes
// the workspace's admin scope (owners and admins); members see a note. Amounts stay the API's
// exact decimal strings; only the bars' heights go through floating point.

import { Ctx, isAdmin } from "../api";
import { errorText, h, money, mount, table, td, time } from "../ui";
import "./workspace.css";

interface Wallet {
  balance: string;
  reserved: string;
  available: string;
  currency: string;
}

interface Entry {
  id: string;
  at: string;
  kind: "credit" | "compute" | "model" | "refund";
  amount: string;
  balance_after: string;
  sandbox_id?: string;
  task_id?: string;
  reference?: string;
  model?: string;
  compute_sec?: number;
  input_tokens?: number;
  output_tokens?: number;
}

interface UsageDay {
  date: string;
  compute_cost: string;
  model_cost: string;
}

interface Usage {
  currency: string;
  days: UsageDay[];
  totals: { compute_cost: string; model_cost: string };
}

const PAGE = 25;
const DAYS = 30;
const SVG_NS = "http://www.w3.org/2000/svg";

export function render(root: HTMLElement, ctx: Ctx): () => void {
  let gone = false;
  const id = encodeURIComponent(ctx.workspace.id);
  const head = h(
    "div",
    { class: "page-head" },
    h("div", null, h("h1", { id: "wallet-title" }, "Wallet"), h("p", { class: "muted" }, `Money of ${ctx.workspace.name}: credits in, compute and model use out.`)),
  );
  if (!isAdmin(ctx.role)) {
    mount(
      root,
      h("section", { class: "ws-page", "aria-labelledby": "wallet-title" }, head,
        h("p", { class: "notice ws-note" }, "Only owners and admins can see this workspace's wallet and ledger.")),
    );
    return () => {};
  }
  const alert = h("div", { class: "error", role: "alert", hidden: true });
  const summary = h("dl", { class: "cards", "aria-label": "Wallet" });
  const chart = h("figure", { class: "chart panel", "aria-labelledby": "chart-head" }, h("p", { class: "empty" }, "Loading…"));
  const ledger = h("div", { class: "panel" }, h("p", { class: "empty" }, "Loading…"));
  // cursors[i] opens page i of the ledger (page 0 needs none).
  const cursors: (string | null)[] = [null];
  let currency = ctx.workspace.currency ?? "USD";

  const fail = (e: unknown) => {
    alert.textContent = errorText(e);
    alert.hidden = false;
  };

  const loadWallet = async () => {
    const w = await ctx.api.get<Wallet>(`/workspaces/${id}/wallet`);
    currency = w.currency;
    const card = (term: string, v: string, note: string) =>
      h("div", { class: "card", "data-figure": term.toLowerCase() }, h("dt", null, term), h("dd", null, money(v, w.currency)), h("dd", { class: "sub" }, note));
    mount(
      summary,
      card("Balance", w.balance, "credits less charges"),
      card("Reserved", w.reserved, "held for running work"),
      card("Available", w.available, "balance less reserved"),
    );
  };

  const entryRow = (e: Entry): HTMLTableRowElement => {
    const what = [
      e.reference,
      e.task_id ? `task run ${e.task_id}` : undefined,
      e.sandbox_id && !e.task_id ? `sandbox ${e.sandbox_id}` : undefined,
      e.model ? `${e.model}${e.input_tokens !== undefined ? ` (${e.input_tokens} in, ${e.output_tokens ?? 0} out tokens)` : ""}` : undefined,
      e.compute_sec !== undefined ? `${e.compute_sec} s` : undefined,
    ]
      .filter(Boolean)
      .join(" · ");
    return h(
      "tr",
      { "data-entry": e.id },
      td("Time", time(e.at)),
      td("Kind", h("span", { class: `badge kind-${e.kind}` }, e.kind)),
      h("td", { "data-label": "Amount", class: "num" }, money(e.amount, currency)),
      h("td", { "data-label": "Balance after", class: "num" }, money(e.balance_after, currency)),
      td("Details", what || "—"),
    );
  };

  const loadLedger = async (p: number) => {
    const q = new URLSearchParams({ limit: String(PAGE) });
    const c = cursors[p];
    if (c) q.set("cursor", c);
    const page = await ctx.api.list<Entry>(`/workspaces/${id}/ledger?${q}`);
    if (gone) return;
    cursors[p + 1] = page.next_cursor;
    const newer = h("button", { type: "button", class: "secondary small", disabled: p === 0 }, "Newer");
    const older = h("button", { type: "button", class: "secondary small", disabled: !page.next_cursor }, "Older");
    newer.addEventListener("click", () => void loadLedger(p - 1).catch(fail));
    older.addEventListener("click", () => void loadLedger(p + 1).catch(fail));
    const pager = h("nav", { class: "pager", "aria-label": "Ledger pages" }, newer, h("span", { class: "muted", "aria-live": "polite" }, `Page ${p + 1}`), older);
    if (page.data.length === 0) {
      mount(ledger, h("p", { class: "empty" }, p === 0 ? "No entries yet. Credits, compute and model charges appear here." : "No more entries."), pager);
      return;
    }
    const tbl = table(["Time", "Kind", "Amount", "Balance after", "Details"], page.data.map(entryRow), "Ledger, newest first");
    for (const i of [2, 3]) tbl.tHead?.rows[0].cells[i].classList.add("num");
    mount(ledger, tbl, pager);
  };

  const loadUsage = async () => {
    const u = await ctx.api.get<Usage>(`/workspaces/${id}/usage`);
    if (gone) return;
    // Drawn at the width it has (less the figure's padding), so its text keeps its size.
    mount(chart, drawChart(u, Math.max(300, Math.min(960, chart.clientWidth - 32))));
  };

  mount(
    root,
    h(
      "section",
      { class: "ws-page", "aria-labelledby": "wallet-title" },
      head,
      alert,
      summary,
      h("h2", { id: "chart-head" }, `Daily cost, last ${DAYS} days`),
      chart,
      h("h2", null, "Ledger"),
      ledger,
    ),
  );
  void (async () => {
    try {
      await loadWallet();
      await Promise.all([loadLedger(0), loadUsage()]);
    } catch (e) {
      if (!gone) fail(e);
    }
  })();
  return () => {
    gone = true;
  };
}

/** The last DAYS UTC dates up to today, oldest first, as YYYY-MM-DD. */
function lastDays(now: Date): string[] {
  const today = Date.UTC(now.getUTCFullYear(), now.getUTCMonth(), now.getUTCDate());
  const out: string[] = [];
  for (let i = DAYS - 1; i >= 0; i--) out.push(new Date(today - i * 86_400_000).toISOString().slice(0, 10));
  return out;
}

function svg(tag: string, attrs: Record<string, string | number>, text?: string): SVGElement {
  const e = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
  if (text !== undefined) e.textContent = text;
  return e;
}

/** A "nice" top of the scale at or above `max` (1, 2 or 5 times a power of ten). */
function niceTop(max: number): number {
  if (max <= 0) return 1;
  const p = 10 ** Math.floor(Math.log10(max));
  for (const m of [1, 2, 5, 10]) if (m * p >= max) return m * p;
  return 10 * p;
}

/** A bar per day, compute at the bottom and model stacked on it; a scale; a legend; the
 *  figures as a table. */
function drawChart(u: Usage, W: number): Node[] {
  const byDay = new Map(u.days.map((d) => [d.date, d]));
  const days = lastDays(new Date()).map((date) => {
    const d = byDay.get(date);
    return { date, compute: d?.compute_cost ?? "0", model: d?.model_cost ?? "0" };
  });
  const num = (s: string) => Number(s) || 0;
  const top = niceTop(Math.max(0, ...days.map((d) => num(d.compute) + num(d.model))));
  const H = 200, left = 44, right = 8, pad = 12, bottom = 24;
  const plotW = W - left - right, plotH = H - pad - bottom;
  const slot = plotW / days.length;
  const bar = Math.max(3, slot * 0.66);
  const y0 = pad + plotH;
  const label =
    `Daily compute and model cost, the last ${DAYS} days. In total compute ${money(u.totals.compute_cost, u.currency)} ` +
    `and model ${money(u.totals.model_cost, u.currency)}; ${u.days.length} ${u.days.length === 1 ? "day" : "days"} with usage. The figures are in the table below.`;

  const s = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": label, class: "bars", width: W, height: H });
  s.append(svg("title", {}, label));
  for (const f of [0, 0.5, 1]) {
    const y = y0 - f * plotH;
    s.append(svg("line", { x1: left, x2: W - right, y1: y, y2: y, class: f === 0 ? "axis" : "gridline" }));
    s.append(svg("text", { x: left - 6, y: y + 4, class: "tick", "text-anchor": "end" }, fmtScale(top * f)));
  }
  days.forEach((d, i) => {
    const x = left + i * slot + (slot - bar) / 2;
    const ch = (num(d.compute) / top) * plotH;
    const mh = (num(d.model) / top) * plotH;
    const tip = `${d.date}: compute ${money(d.compute, u.currency)}, model ${money(d.model, u.currency)}`;
    if (ch > 0) s.append(svg("rect", { x, y: y0 - Math.max(ch, 1), width: bar, height: Math.max(ch, 1), class: "compute" }, undefined));
    if (mh > 0) s.append(svg("rect", { x, y: y0 - Math.max(ch, 0) - Math.max(mh, 1), width: bar, height: Math.max(mh, 1), class: "model" }));
    if (ch > 0 || mh > 0) s.lastElementChild?.append(svg("title", {}, tip));
    // A date under every 7th bar, ending with today's.
    if ((days.length - 1 - i) % 7 === 0) {
      // The last one (today's) ends at the bar's right edge, so that it is not cut off.
      const lastOne = i === days.length - 1;
      s.append(svg("text", { x: lastOne ? x + bar : x + bar / 2, y: H - 8, class: "tick", "text-anchor": lastOne ? "end" : "middle" }, d.date.slice(5)));
    }
  });

  const legend = h(
    "p",
    { class: "legend", "aria-hidden": "true" },
    h("span", { class: "swatch compute" }),
    "Compute",
    h("span", { class: "swatch model" }),
    "Model",
    h("span", { class: "muted" }, ` · ${u.currency} per UTC day`),
  );
  const used = days.filter((d) => num(d.compute) > 0 || num(d.model) > 0);
  const figures = used.length
    ? table(
        ["Day (UTC)", "Compute", "Model"],
        used.map((d) =>
          h("tr", null, td("Day (UTC)", d.date), h("td", { "data-label": "Compute", class: "num" }, money(d.compute, u.currency)), h("td", { "data-label": "Model", class: "num" }, money(d.model, u.currency))),
        ),
        "Daily compute and model cost",
      )
    : h("p", { class: "empty" }, "No compute or model use in these days.");
  return [
    s,
    h("figcaption", null, legend),
    h("details", { class: "figures" }, h("summary", null, "The figures as a table"), figures),
  ];
}

function fmtScale(v: number): string {
  if (v === 0) return "0";
  return v >= 1 ? v.toFixed(v >= 10 ? 0 : 1) : v.toPrecision(1);
}
