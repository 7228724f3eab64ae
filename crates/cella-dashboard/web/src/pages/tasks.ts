// Task runs: the workspace's runs, newest first, one page at a time (never all of them), live;
// the Start dialog; Stop with a confirmation.
//
// Live: the page is read again every 5 s while it is shown, and each run on it that is not
// finished (at most four: a browser opens only six connections to one server) follows its
// `events` stream, so its state word changes as it happens.

import { ApiError, Ctx, isAdmin } from "../api";
import { badge, confirmDialog, duration, errorText, h, isTerminal, money, mount, table, td, time, toast, trapFocus } from "../ui";

export interface Task {
  id: string;
  workspace_id: string;
  created_by: string;
  repository: string;
  base_branch: string;
  branch: string;
  forge: string;
  agent: string;
  state: string;
  failure_reason: string | null;
  stop_reason: string | null;
  pull_request: { number: number; url: string; draft: boolean } | null;
  queued_at: string;
  started_at: string | null;
  ended_at: string | null;
  compute_sec: number;
  compute_rate: string;
  compute_cost: string;
  model_cost: string;
  model_requests: number;
  session_limit_min: number;
  metadata: Record<string, string>;
}

const PAGE_SIZE = 50;
const REFRESH_MS = 5000;
const MAX_STREAMS = 4;
const STATES = ["queued", "provisioning", "running", "stopped", "failed", "cancelled"];

/** Compute seconds so far: the API's figure, or for a running run the time since it started. */
export function computeSec(t: Task): number {
  if (t.state === "running" && t.started_at && !t.ended_at) {
    return Math.max(t.compute_sec ?? 0, (Date.now() - Date.parse(t.started_at)) / 1000);
  }
  return t.compute_sec ?? 0;
}

/** The pull request's link, or the branch (a `git` forge opens no pull request). */
export function handoff(t: Task): HTMLElement | string {
  if (t.pull_request) {
    return h(
      "a",
      { href: t.pull_request.url, target: "_blank", rel: "noopener noreferrer", class: "pr" },
      `#${t.pull_request.number}${t.pull_request.draft ? " (draft)" : ""}`,
    );
  }
  if (t.branch) return h("code", { class: "branch", title: `branch ${t.branch}` }, t.branch);
  return "—";
}

/** Asks, then cancels a run. Resolves with the run as the API answers, or null. */
export async function stopRun(ctx: Ctx, t: Task): Promise<Task | null> {
  const ok = await confirmDialog({
    title: "Stop this run?",
    message: `The agent working on ${t.repository} is stopped. What it committed is pushed to ${t.branch} and opened as a draft.`,
    confirm: "Stop run",
    danger: true,
  });
  if (!ok) return null;
  try {
    const got = await ctx.api.post<Task>(`/tasks/${encodeURIComponent(t.id)}/cancel`);
    toast(`Stopping the run on ${t.repository}.`);
    return got;
  } catch (e) {
    toast(errorText(e), "error");
    return null;
  }
}

export function render(root: HTMLElement, ctx: Ctx): () => void {
  const currency = ctx.workspace.currency ?? "USD";
  let cursors: (string | null)[] = [null]; // the cursor of each page seen, for Previous
  let pageNo = 0;
  let next: string | null = null;
  let stateFilter = "";
  let rows: Task[] = [];
  const streams = new Map<string, () => void>();
  let timer: number | undefined;
  let gone = false;
  let painted = false;

  const startBtn = h("button", { type: "button", class: "primary", "aria-haspopup": "dialog" }, "Start");
  const filter = h(
    "select",
    { id: "state-filter" },
    h("option", { value: "" }, "All"),
    STATES.map((s) => h("option", { value: s }, s)),
  );
  const body = h("div", { class: "panel" }, h("p", { class: "empty" }, "Loading…"));
  const notice = ctx.workspace.settings?.tasks_enabled
    ? null
    : h(
        "p",
        { class: "notice" },
        "Task runs are off in this workspace. ",
        isAdmin(ctx.role)
          ? h("a", { href: "#/settings" }, "Turn them on in Settings.")
          : "An owner or admin can turn them on in Settings.",
      );
  mount(
    root,
    h(
      "div",
      { class: "page-head" },
      h("div", null, h("h1", null, "Task runs"), h("p", { class: "muted" }, "An agent works on a repository on a new branch and opens a draft pull request.")),
      h("div", { class: "tools" }, h("label", { for: "state-filter" }, "State"), filter, startBtn),
    ),
    notice,
    body,
  );

  filter.addEventListener("change", () => {
    stateFilter = filter.value;
    cursors = [null];
    pageNo = 0;
    void load();
  });
  startBtn.addEventListener("click", () => openStart(ctx, (t) => {
    if (pageNo === 0) {
      rows = [t, ...rows.filter((r) => r.id !== t.id)].slice(0, PAGE_SIZE);
      draw();
    }
  }));

  async function load(): Promise<void> {
    const q = new URLSearchParams({ limit: String(PAGE_SIZE) });
    const c = cursors[pageNo];
    if (c) q.set("cursor", c);
    if (stateFilter) q.set("state", stateFilter);
    try {
      const page = await ctx.api.list<Task>(`/tasks?${q}`);
      if (gone) return;
      rows = page.data;
      next = page.next_cursor;
      draw();
    } catch (e) {
      if (gone) return;
      mount(body, h("p", { class: "error", role: "alert" }, errorText(e)));
    }
  }

  function update(t: Task): void {
    const i = rows.findIndex((r) => r.id === t.id);
    if (i >= 0) {
      rows[i] = t;
      draw();
    }
  }

  function follow(): void {
    const live = rows.filter((t) => !isTerminal(t.state)).slice(0, MAX_STREAMS);
    const want = new Set(live.map((t) => t.id));
    for (const [id, close] of streams) {
      if (!want.has(id)) {
        close();
        streams.delete(id);
      }
    }
    for (const t of live) {
      if (streams.has(t.id)) continue;
      const close = ctx.api.sse(
        `/tasks/${encodeURIComponent(t.id)}/events`,
        {
          state: (ev: { state: string; failure_reason: string | null; stop_reason: string | null; at: string }) => {
            const r = rows.find((x) => x.id === t.id);
            if (!r || r.state === ev.state) return;
            const changed: Task = { ...r, state: ev.state, failure_reason: ev.failure_reason, stop_reason: ev.stop_reason };
            if (ev.state === "running" && !changed.started_at) changed.started_at = ev.at;
            update(changed);
            if (isTerminal(ev.state)) {
              // The costs, the pull request and the times settle with the end: read it again.
              ctx.api.get<Task>(`/tasks/${encodeURIComponent(t.id)}`).then(update, () => {});
            }
          },
        },
        () => streams.delete(t.id),
      );
      streams.set(t.id, close);
    }
  }

  function draw(): void {
    // A redraw keeps the keyboard's place: the focused control is found again by its key.
    const focused = (document.activeElement as HTMLElement | null)?.dataset?.focus;
    paint();
    if (focused) body.querySelector<HTMLElement>(`[data-focus="${CSS.escape(focused)}"]`)?.focus();
  }

  function paint(): void {
    if (rows.length === 0) {
      mount(
        body,
        h("p", { class: "empty" }, stateFilter ? `No ${stateFilter} runs.` : "No task runs yet. Start one with the Start button."),
        pager(),
      );
      follow();
      return;
    }
    const trs = rows.map((t) =>
      h(
        "tr",
        { "data-task": t.id },
        td("State", badge(t.state), t.failure_reason ? h("span", { class: "sub", title: t.failure_reason }, t.failure_reason.split(":")[0]) : null),
        td(
          "Repository",
          h("a", { href: `#/tasks/${encodeURIComponent(t.id)}`, class: "run-link", "data-focus": `open-${t.id}` }, t.repository),
          h("span", { class: "sub" }, `from ${t.base_branch}`),
        ),
        td("Pull request", handoff(t)),
        h("td", { "data-label": "Compute time", class: "num" }, duration(computeSec(t))),
        h("td", { "data-label": "Compute cost", class: "num" }, money(t.compute_cost, currency)),
        h("td", { "data-label": "Model cost", class: "num" }, money(t.model_cost, currency)),
        td("Started", time(t.queued_at)),
        td(
          "Actions",
          h(
            "div",
            { class: "actions" },
            !isTerminal(t.state)
              ? h(
                  "button",
                  {
                    type: "button",
                    class: "secondary small",
                    "data-focus": `stop-${t.id}`,
                    "aria-label": `Stop the run on ${t.repository}`,
                    on: {
                      click: async () => {
                        const got = await stopRun(ctx, t);
                        if (got) update(got);
                      },
                    },
                  },
                  "Stop",
                )
              : null,
          ),
        ),
      ),
    );
    const tbl = table(
      ["State", "Repository", "Pull request", "Compute time", "Compute cost", "Model cost", "Started", ""],
      trs,
      "Task runs",
    );
    for (const i of [3, 4, 5]) tbl.tHead?.rows[0].cells[i].classList.add("num");
    const actionsHead = tbl.tHead?.rows[0].cells[7];
    if (actionsHead) actionsHead.append(h("span", { class: "sr-only" }, "Actions"));
    mount(body, tbl, pager());
    follow();
    if (!painted) {
      painted = true;
      // When the first page of runs is on screen (the frame after it is laid out): the figure
      // the browser suite prints.
      requestAnimationFrame(() => performance.mark("cella:tasks-first-paint"));
    }
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
  timer = window.setInterval(() => {
    if (!document.hidden) void load();
  }, REFRESH_MS);
  return () => {
    gone = true;
    window.clearInterval(timer);
    for (const close of streams.values()) close();
    streams.clear();
  };
}

const REPO_RE = /^[A-Za-z0-9_][A-Za-z0-9._-]{0,99}(\/[A-Za-z0-9_][A-Za-z0-9._-]{0,99})+$/;

/** The Start dialog: repository, base branch, task. Checks what it can before sending, and
 *  shows the API's refusals in words (task runs off, wallet too low, unknown repository). */
export function openStart(ctx: Ctx, started: (t: Task) => void): void {
  const field = (id: string, label: string, control: HTMLInputElement | HTMLTextAreaElement, hint?: string) => {
    const err = h("p", { class: "field-error", id: `${id}-error`, hidden: true });
    const hintEl = hint ? h("p", { class: "hint", id: `${id}-hint` }, hint) : null;
    control.id = id;
    control.setAttribute("aria-describedby", [hint ? `${id}-hint` : "", `${id}-error`].filter(Boolean).join(" "));
    return { wrap: h("div", { class: "field" }, h("label", { for: id }, label), control, hintEl, err), err, control };
  };
  const repo = field("start-repository", "Repository", h("input", { name: "repository", autocomplete: "off", placeholder: "owner/name", required: true }), "owner/name, as the forge knows it.");
  const base = field("start-base", "Base branch", h("input", { name: "base_branch", autocomplete: "off", placeholder: "the repository's default branch" }));
  const taskF = field("start-task", "Task", h("textarea", { name: "task", required: true, rows: 5, placeholder: "What should the agent do?" }));
  const alert = h("div", { class: "error", role: "alert", hidden: true });
  const submit = h("button", { type: "submit", class: "primary" }, "Start");
  const cancel = h("button", { type: "button", class: "secondary" }, "Cancel");
  const form = h(
    "form",
    { novalidate: true },
    h("h2", { id: "start-title" }, "Start a task run"),
    h("p", { class: "muted" }, `Workspace: ${ctx.workspace.name}`),
    repo.wrap,
    base.wrap,
    taskF.wrap,
    alert,
    h("div", { class: "actions" }, cancel, submit),
  );
  const dlg = h("dialog", { class: "start", "aria-labelledby": "start-title" }, form);

  const setError = (f: { err: HTMLElement; control: HTMLElement }, msg: string | null) => {
    f.err.textContent = msg ?? "";
    f.err.hidden = !msg;
    if (msg) f.control.setAttribute("aria-invalid", "true");
    else f.control.removeAttribute("aria-invalid");
  };
  const showAlert = (...parts: (string | Node)[]) => {
    alert.replaceChildren(...parts);
    alert.hidden = parts.length === 0;
  };

  cancel.addEventListener("click", () => dlg.close());
  dlg.addEventListener("close", () => dlg.remove());
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    showAlert();
    const repository = repo.control.value.trim();
    const baseBranch = base.control.value.trim();
    const text = taskF.control.value;
    setError(repo, !repository ? "Name the repository." : REPO_RE.test(repository) ? null : "A repository is owner/name: letters, digits, '.', '_' and '-'.");
    setError(taskF, text.trim() ? null : "Say what the agent should do.");
    setError(base, /\s/.test(baseBranch) ? "A branch name has no spaces." : null);
    const firstBad = [repo, base, taskF].find((f) => f.control.getAttribute("aria-invalid") === "true");
    if (firstBad) {
      firstBad.control.focus();
      return;
    }
    submit.disabled = true;
    submit.textContent = "Starting…";
    try {
      const body: Record<string, string> = { repository, task: text };
      if (baseBranch) body.base_branch = baseBranch;
      const t = await ctx.api.post<Task>("/tasks", body);
      dlg.close();
      toast(`Started a run on ${t.repository}.`);
      started(t);
    } catch (e) {
      submit.disabled = false;
      submit.textContent = "Start";
      if (!(e instanceof ApiError)) {
        showAlert(errorText(e));
        return;
      }
      const d = e.details ?? {};
      if (e.code === "FORBIDDEN" && d.reason === "tasks_disabled") {
        showAlert(
          h("strong", null, "Task runs are not enabled for this workspace. "),
          isAdmin(ctx.role)
            ? h("a", { href: "#/settings", on: { click: () => dlg.close() } }, "Turn them on in Settings.")
            : "Ask an owner or admin to turn them on in Settings.",
        );
      } else if (e.code === "INSUFFICIENT_FUNDS") {
        const cur = ctx.workspace.currency ?? "USD";
        showAlert(
          h("strong", null, "The wallet is too low for this run. "),
          typeof d.needed === "string" && typeof d.available === "string"
            ? `It needs ${money(d.needed, cur)} reserved and ${money(d.available, cur)} is available. `
            : "",
          isAdmin(ctx.role) ? h("a", { href: "#/wallet", on: { click: () => dlg.close() } }, "See the wallet.") : "",
        );
      } else if (e.code === "NOT_FOUND") {
        const msg = e.message;
        if (/branch/i.test(msg) && baseBranch) {
          setError(base, msg);
          base.control.focus();
        } else {
          setError(repo, `Unknown repository: ${msg}`);
          repo.control.focus();
        }
        showAlert(h("strong", null, "Unknown repository or branch. "), msg);
      } else if (e.code === "INVALID_REQUEST" && typeof d.field === "string") {
        const f = d.field === "repository" ? repo : d.field === "base_branch" ? base : d.field === "task" ? taskF : null;
        if (f) {
          setError(f, e.message);
          f.control.focus();
        }
        showAlert(e.message);
      } else if (e.code === "RATE_LIMITED") {
        showAlert("Too many starts just now. Wait a moment and try again.");
      } else {
        showAlert(e.message);
      }
    }
  });
  document.body.appendChild(dlg);
  trapFocus(dlg);
  dlg.showModal();
  repo.control.focus();
}
