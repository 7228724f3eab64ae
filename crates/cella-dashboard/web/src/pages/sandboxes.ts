// Sandboxes: the workspace's sandboxes (state, size, template, age, usage) with pause, resume
// and destroy, and a terminal (`#/sandboxes/{id}/terminal`) over the API's PTY WebSocket, drawn
// with xterm.js (loaded only when a terminal is opened).

import { Ctx } from "../api";
import { ago, badge, confirmDialog, duration, errorText, h, isTerminal, money, mount, table, td, toast } from "../ui";

interface Sandbox {
  id: string;
  template_id: string;
  state: string;
  size: string;
  cpu_count: number;
  memory_mb: number;
  disk_size_mb: number;
  created_at: string;
  started_at: string | null;
  total_runtime_sec: number | null;
  compute_cost: string;
  model_cost: string;
  metadata: Record<string, string>;
  state_reason: string | null;
}

const REFRESH_MS = 5000;
const PAGE_SIZE = 50;

export function render(root: HTMLElement, ctx: Ctx): void | (() => void) {
  if (ctx.params[1] === "terminal" && ctx.params[0]) return terminal(root, ctx, ctx.params[0]);
  return list(root, ctx);
}

function memory(mb: number): string {
  return mb >= 1024 ? `${(mb / 1024).toFixed(mb % 1024 ? 1 : 0)} GiB` : `${mb} MiB`;
}

function list(root: HTMLElement, ctx: Ctx): () => void {
  const currency = ctx.workspace.currency ?? "USD";
  let rows: Sandbox[] = [];
  let showDestroyed = false;
  let cursors: (string | null)[] = [null];
  let pageNo = 0;
  let next: string | null = null;
  let gone = false;
  const busy = new Set<string>();

  const body = h("div", { class: "panel" }, h("p", { class: "empty" }, "Loading…"));
  const toggle = h("input", { type: "checkbox", id: "show-destroyed" });
  toggle.style.width = "auto";
  const create = h("button", { type: "button", class: "primary" }, "New sandbox");
  mount(
    root,
    h(
      "div",
      { class: "page-head" },
      h("div", null, h("h1", null, "Sandboxes"), h("p", { class: "muted" }, "Isolated machines of this workspace.")),
      h("div", { class: "tools" }, toggle, h("label", { for: "show-destroyed" }, "Show destroyed"), create),
    ),
    body,
  );
  toggle.addEventListener("change", () => {
    showDestroyed = toggle.checked;
    paint();
  });
  create.addEventListener("click", async () => {
    create.disabled = true;
    try {
      const sb = await ctx.api.post<Sandbox>("/sandboxes", { wait: false });
      toast(`Creating ${sb.id}.`);
      await load();
    } catch (e) {
      toast(errorText(e), "error");
    } finally {
      create.disabled = false;
    }
  });

  async function load(): Promise<void> {
    const q = new URLSearchParams({ limit: String(PAGE_SIZE) });
    const c = cursors[pageNo];
    if (c) q.set("cursor", c);
    try {
      const page = await ctx.api.list<Sandbox>(`/sandboxes?${q}`);
      if (gone) return;
      rows = page.data;
      next = page.next_cursor;
      paint();
    } catch (e) {
      if (!gone) mount(body, h("p", { class: "error", role: "alert" }, errorText(e)));
    }
  }

  async function act(sb: Sandbox, what: "pause" | "resume" | "destroy"): Promise<void> {
    if (what === "destroy") {
      const ok = await confirmDialog({
        title: "Destroy this sandbox?",
        message: `${sb.id} and its files are removed for good.`,
        confirm: "Destroy",
        danger: true,
      });
      if (!ok) return;
    }
    busy.add(sb.id);
    paint();
    try {
      const path = `/sandboxes/${encodeURIComponent(sb.id)}`;
      const got = what === "destroy" ? await ctx.api.del<Sandbox>(path) : await ctx.api.post<Sandbox>(`${path}/${what}`);
      const i = rows.findIndex((r) => r.id === sb.id);
      if (i >= 0 && got && typeof got === "object" && "state" in got) rows[i] = got;
      toast(`${sb.id}: ${what === "destroy" ? "destroyed" : what === "pause" ? "paused" : "resumed"}.`);
    } catch (e) {
      toast(errorText(e), "error");
    } finally {
      busy.delete(sb.id);
      paint();
    }
  }

  function paint(): void {
    const focused = (document.activeElement as HTMLElement | null)?.dataset?.focus;
    const shown = rows.filter((s) => showDestroyed || s.state !== "destroyed");
    if (shown.length === 0) {
      mount(body, h("p", { class: "empty" }, "No sandboxes. Make one with New sandbox, the CLI or an SDK."), pager());
      return;
    }
    const btn = (sb: Sandbox, label: string, what: "pause" | "resume" | "destroy", cls = "secondary small") =>
      h(
        "button",
        {
          type: "button",
          class: cls,
          disabled: busy.has(sb.id),
          "data-focus": `${what}-${sb.id}`,
          "aria-label": `${label} ${sb.id}`,
          on: { click: () => void act(sb, what) },
        },
        label,
      );
    const trs = shown.map((sb) =>
      h(
        "tr",
        { "data-sandbox": sb.id },
        td("Sandbox", h("code", null, sb.id), sb.metadata && Object.keys(sb.metadata).length
          ? h("span", { class: "sub" }, Object.entries(sb.metadata).slice(0, 2).map(([k, v]) => `${k}=${v}`).join(" "))
          : null),
        td("State", badge(sb.state), sb.state_reason ? h("span", { class: "sub", title: sb.state_reason }, sb.state_reason.slice(0, 60)) : null),
        td("Size", sb.size, h("span", { class: "sub" }, `${sb.cpu_count} CPU · ${memory(sb.memory_mb)} · ${memory(sb.disk_size_mb)} disk`)),
        td("Template", sb.template_id),
        h("td", { "data-label": "Age", class: "nowrap" }, ago(sb.created_at)),
        td(
          "Usage",
          duration(sb.total_runtime_sec ?? 0),
          h("span", { class: "sub" }, `${money(sb.compute_cost, currency)} compute · ${money(sb.model_cost, currency)} models`),
        ),
        td(
          "Actions",
          h(
            "div",
            { class: "actions" },
            sb.state === "running"
              ? h("a", { class: "button secondary small", href: `#/sandboxes/${encodeURIComponent(sb.id)}/terminal`, "data-focus": `term-${sb.id}`, "aria-label": `Terminal of ${sb.id}` }, "Terminal")
              : null,
            sb.state === "running" ? btn(sb, "Pause", "pause") : null,
            sb.state === "paused" || sb.state === "stopped" ? btn(sb, "Resume", "resume") : null,
            !isTerminal(sb.state) ? btn(sb, "Destroy", "destroy", "secondary small danger-text") : null,
          ),
        ),
      ),
    );
    const tbl = table(["Sandbox", "State", "Size", "Template", "Age", "Usage", ""], trs, "Sandboxes");
    tbl.tHead?.rows[0].cells[6].append(h("span", { class: "sr-only" }, "Actions"));
    mount(body, tbl, pager());
    if (focused) body.querySelector<HTMLElement>(`[data-focus="${CSS.escape(focused)}"]`)?.focus();
  }

  function pager(): HTMLElement | null {
    if (pageNo === 0 && !next) return null;
    const prev = h("button", { type: "button", class: "secondary small", disabled: pageNo === 0 }, "Previous page");
    const more = h("button", { type: "button", class: "secondary small", disabled: !next }, "Next page");
    prev.addEventListener("click", () => {
      if (pageNo > 0) {
        pageNo--;
        void load();
      }
    });
    more.addEventListener("click", () => {
      if (next) {
        cursors[pageNo + 1] = next;
        pageNo++;
        void load();
      }
    });
    return h("div", { class: "pager" }, prev, h("span", { class: "muted" }, `Page ${pageNo + 1}`), more);
  }

  void load();
  const timer = window.setInterval(() => {
    if (!document.hidden && busy.size === 0) void load();
  }, REFRESH_MS);
  return () => {
    gone = true;
    window.clearInterval(timer);
  };
}

function terminal(root: HTMLElement, ctx: Ctx, id: string): () => void {
  const status = h("p", { class: "term-status", role: "status" }, "Connecting…");
  const wrap = h("div", { class: "term-wrap" });
  const reconnect = h("button", { type: "button", class: "secondary small", hidden: true }, "Reconnect");
  mount(
    root,
    h("p", null, h("a", { href: "#/sandboxes" }, "← Sandboxes")),
    h(
      "div",
      { class: "page-head" },
      h("div", null, h("h1", null, "Terminal"), h("p", { class: "muted mono" }, id)),
      h("div", { class: "tools" }, reconnect),
    ),
    status,
    h("section", { "aria-label": `Terminal of ${id}` }, wrap),
  );
  let gone = false;
  let cleanup: (() => void) | null = null;

  async function open(): Promise<void> {
    const [{ Terminal }, { FitAddon }] = await Promise.all([
      import("@xterm/xterm"),
      import("@xterm/addon-fit"),
      import("@xterm/xterm/css/xterm.css"),
    ]);
    if (gone) return;
    wrap.replaceChildren();
    const term = new Terminal({
      cursorBlink: true,
      fontSize: 14,
      fontFamily: 'ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace',
      theme: { background: "#11151c", foreground: "#dfe6ef" },
      scrollback: 5000,
    });
    const fit = new FitAddon();
    term.loadAddon(fit);
    term.open(wrap);
    try {
      fit.fit();
    } catch {
      /* not laid out yet */
    }
    const q = new URLSearchParams({ cols: String(term.cols || 80), rows: String(term.rows || 24) });
    // The session cookie (and the workspace cookie) go with the upgrade; the server checks the
    // request's Origin is its own.
    const sock = new WebSocket(ctx.api.wsUrl(`/sandboxes/${encodeURIComponent(id)}/pty?${q}`));
    sock.binaryType = "arraybuffer";
    const enc = new TextEncoder();
    let exited = false;
    sock.onopen = () => {
      status.textContent = "Connected.";
      reconnect.hidden = true;
      term.focus();
    };
    sock.onmessage = (ev) => {
      if (typeof ev.data === "string") {
        try {
          const msg = JSON.parse(ev.data);
          if (msg && msg.exit) {
            exited = true;
            status.textContent = `The program exited with code ${msg.exit.exit_code}.`;
            return;
          }
        } catch {
          /* text that is not JSON: show it */
        }
        term.write(ev.data);
      } else {
        term.write(new Uint8Array(ev.data as ArrayBuffer));
      }
    };
    sock.onclose = () => {
      if (gone) return;
      if (!exited) {
        status.textContent =
          "The terminal closed. The sandbox may not be running (a paused sandbox must be resumed first), or the connection dropped.";
      }
      reconnect.hidden = false;
    };
    const onData = term.onData((d) => {
      if (sock.readyState === WebSocket.OPEN) sock.send(enc.encode(d));
    });
    const onResize = term.onResize(({ cols, rows }) => {
      if (sock.readyState === WebSocket.OPEN) sock.send(JSON.stringify({ resize: { cols, rows } }));
    });
    const refit = () => {
      try {
        fit.fit();
      } catch {
        /* gone */
      }
    };
    window.addEventListener("resize", refit);
    cleanup = () => {
      window.removeEventListener("resize", refit);
      onData.dispose();
      onResize.dispose();
      sock.close();
      term.dispose();
    };
  }

  reconnect.addEventListener("click", () => {
    cleanup?.();
    cleanup = null;
    status.textContent = "Connecting…";
    void open().catch((e) => (status.textContent = errorText(e)));
  });
  void open().catch((e) => (status.textContent = errorText(e)));
  return () => {
    gone = true;
    cleanup?.();
  };
}
