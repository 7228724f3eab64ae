// One task run: what it is, its timeline of states, and its live log while it runs.
//
// The timeline starts from the run's own times (queued, started, ended) and adds every state
// the `events` stream reports while the page is open; the log follows the `log` stream (the
// agent's output is never stored, so a finished run has none to show).

import { ApiError, Ctx } from "../api";
import { badge, duration, errorText, h, isTerminal, money, mount, time } from "../ui";
import { Task, computeSec, handoff, stopRun } from "./tasks";

interface Step {
  state: string;
  at: string | null;
}

export function render(root: HTMLElement, ctx: Ctx): () => void {
  const id = ctx.params[0] ?? "";
  const currency = ctx.workspace.currency ?? "USD";
  let t: Task | null = null;
  let steps: Step[] = [];
  let closeEvents: (() => void) | null = null;
  let closeLog: (() => void) | null = null;
  let gone = false;
  let tick: number | undefined;
  let computeEl: HTMLElement | null = null;

  const head = h("div", { class: "page-head" });
  const facts = h("dl", { class: "facts" });
  const timeline = h("ol", { class: "timeline", "aria-label": "States" });
  const log = h("pre", { class: "log", tabindex: "0", "aria-label": "Agent output" });
  const logNote = h("p", { class: "muted" });
  mount(
    root,
    h("p", null, h("a", { href: "#/tasks" }, "← Task runs")),
    head,
    h("div", { class: "panel" }, facts),
    h(
      "div",
      { class: "two" },
      h("section", { "aria-labelledby": "tl-h" }, h("h2", { id: "tl-h" }, "Timeline"), h("div", { class: "panel" }, timeline)),
      h("section", { "aria-labelledby": "log-h" }, h("h2", { id: "log-h" }, "Live log"), logNote, h("div", { class: "panel" }, log)),
    ),
  );

  function addStep(state: string, at: string | null): void {
    if (steps.some((s) => s.state === state)) return;
    steps.push({ state, at });
  }

  function fromObject(x: Task): void {
    addStep("queued", x.queued_at);
    if (x.started_at) addStep("running", x.started_at);
    if (isTerminal(x.state)) addStep(x.state, x.ended_at);
    else addStep(x.state, null);
    const order = ["queued", "provisioning", "running", "stopped", "failed", "cancelled"];
    steps.sort((a, b) => order.indexOf(a.state) - order.indexOf(b.state));
  }

  function draw(): void {
    if (!t) return;
    const x = t;
    const stop = !isTerminal(x.state)
      ? h(
          "button",
          {
            type: "button",
            class: "danger",
            on: {
              click: async () => {
                const got = await stopRun(ctx, x);
                if (got) {
                  t = got;
                  fromObject(got);
                  draw();
                }
              },
            },
          },
          "Stop",
        )
      : null;
    mount(
      head,
      h("div", null, h("h1", null, x.repository, " ", badge(x.state)), h("p", { class: "muted mono" }, x.id)),
      h("div", { class: "tools" }, stop),
    );
    const fact = (label: string, ...value: (Node | string)[]) => h("div", null, h("dt", null, label), h("dd", null, ...value));
    mount(
      facts,
      fact("State", x.state),
      fact("Pull request", x.pull_request ? handoff(x) : h("span", { class: "muted" }, "none (the branch is the hand-off)")),
      fact("Base branch", h("code", null, x.base_branch)),
      fact("Branch", h("code", null, x.branch)),
      fact("Forge", x.forge),
      fact("Agent", x.agent),
      fact("Compute time", (computeEl = h("span", null, duration(computeSec(x))))),
      fact("Compute cost", money(x.compute_cost, currency)),
      fact("Model cost", money(x.model_cost, currency)),
      fact("Model requests", String(x.model_requests ?? 0)),
      fact("Compute rate", `${money(x.compute_rate, currency)} / s`),
      fact("Session limit", `${x.session_limit_min} min`),
      x.stop_reason ? fact("Ended by", x.stop_reason.replace(/_/g, " ")) : "",
      x.failure_reason ? fact("Failure", h("span", { class: "bad-text" }, x.failure_reason)) : "",
    );
    mount(
      timeline,
      steps.map((s) => h("li", null, badge(s.state), s.at ? time(s.at) : h("span", { class: "at" }, "now"))),
    );
  }

  function followLog(): void {
    if (!t || isTerminal(t.state) || closeLog) return;
    logNote.textContent = t.state === "queued" ? "Waiting for the agent to start…" : "The agent's output, as it comes.";
    closeLog = ctx.api.sse(
      `/tasks/${encodeURIComponent(id)}/log`,
      {
        output: (d: { stream: string; text: string }) => {
          const atEnd = log.scrollTop + log.clientHeight >= log.scrollHeight - 8;
          log.append(d.stream === "stderr" ? h("span", { class: "stderr" }, d.text) : document.createTextNode(d.text));
          if (atEnd) log.scrollTop = log.scrollHeight;
        },
      },
      () => {
        closeLog = null;
        if (t && isTerminal(t.state)) logNote.textContent = "The run has ended. Its output is not kept.";
      },
    );
  }

  function followEvents(): void {
    if (!t || isTerminal(t.state)) return;
    closeEvents = ctx.api.sse(
      `/tasks/${encodeURIComponent(id)}/events`,
      {
        state: (ev: { state: string; at: string; failure_reason: string | null; stop_reason: string | null }) => {
          if (!t) return;
          addStep(ev.state, ev.at);
          t = { ...t, state: ev.state, failure_reason: ev.failure_reason, stop_reason: ev.stop_reason };
          if (ev.state === "running" && !t.started_at) t.started_at = ev.at;
          fromObject(t);
          draw();
          if (ev.state !== "queued") followLog();
          if (isTerminal(ev.state)) void reload();
        },
      },
      () => {
        closeEvents = null;
      },
    );
  }

  async function reload(): Promise<void> {
    try {
      const got = await ctx.api.get<Task>(`/tasks/${encodeURIComponent(id)}`);
      if (gone) return;
      t = got;
      fromObject(got);
      draw();
      if (isTerminal(got.state) && !closeLog) {
        logNote.textContent = "The run has ended. Its output is not kept.";
        if (!log.textContent) log.textContent = "";
      }
    } catch (e) {
      if (gone) return;
      const msg = e instanceof ApiError && e.status === 404 ? "There is no such run in this workspace." : errorText(e);
      mount(root, h("p", null, h("a", { href: "#/tasks" }, "← Task runs")), h("p", { class: "error", role: "alert" }, msg));
    }
  }

  void reload().then(() => {
    if (gone || !t) return;
    document.title = `${t.repository} · Task run · Cella`;
    followEvents();
    followLog();
    if (t && isTerminal(t.state)) logNote.textContent = "The run has ended. Its output is not kept.";
  });
  // The compute time of a running run goes on counting on the page (no request).
  tick = window.setInterval(() => {
    if (t && t.state === "running" && computeEl) computeEl.textContent = duration(computeSec(t));
  }, 1000);
  return () => {
    gone = true;
    window.clearInterval(tick);
    closeEvents?.();
    closeLog?.();
  };
}
