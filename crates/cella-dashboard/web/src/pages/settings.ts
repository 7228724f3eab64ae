// Settings: the workspace's task-run settings. Owners and admins (and the operator) change
// them with one form (`PATCH /api/v1/workspaces/{id}` with `settings`); members see the values
// read-only and no controls (the API answers them 403 anyway). A value the API refuses is
// shown at its field (the error's `details.field`, `settings.<name>`), and nothing changes.

import { ApiError, Ctx, isAdmin, Workspace, WorkspaceSettings } from "../api";
import { errorText, h, mount } from "../ui";
import "./workspace.css";

export function render(root: HTMLElement, ctx: Ctx): () => void {
  let gone = false;
  const status = h("p", { class: "status", role: "status", "aria-live": "polite" });
  const body = h("div", { class: "panel" }, h("p", { class: "empty" }, "Loading…"));
  mount(
    root,
    h(
      "section",
      { class: "ws-page", "aria-labelledby": "settings-title" },
      h(
        "div",
        { class: "page-head" },
        h("div", null, h("h1", { id: "settings-title" }, "Settings"), h("p", { class: "muted" }, `Task runs in ${ctx.workspace.name}.`)),
      ),
      status,
      body,
    ),
  );
  void (async () => {
    try {
      const ws = await ctx.api.get<Workspace>(`/workspaces/${encodeURIComponent(ctx.workspace.id)}`);
      if (gone) return;
      ctx.workspace.settings = ws.settings;
      mount(body, isAdmin(ctx.role) ? form(ctx, ws.settings, status) : readOnly(ws.settings));
    } catch (e) {
      if (!gone) mount(body, h("p", { class: "error", role: "alert" }, errorText(e)));
    }
  })();
  return () => {
    gone = true;
  };
}

function readOnly(s: WorkspaceSettings): HTMLElement {
  const fact = (term: string, value: string) => h("div", null, h("dt", null, term), h("dd", null, value));
  return h(
    "div",
    null,
    h("p", { class: "notice ws-note" }, "Only owners and admins can change these settings."),
    h(
      "dl",
      { class: "facts", "aria-label": "Workspace settings" },
      fact("Task runs", s.tasks_enabled ? "enabled" : "disabled"),
      fact("Compute rate (per second)", s.compute_rate),
      fact("Session limit (minutes)", String(s.session_limit_min)),
      fact("Heartbeat timeout (seconds)", String(s.heartbeat_timeout_sec)),
      fact("Model allowlist", s.model_allowlist.length ? s.model_allowlist.join(", ") : "all models"),
    ),
  );
}

interface Field {
  wrap: HTMLElement;
  error: HTMLElement;
  input: HTMLInputElement | HTMLTextAreaElement;
}

/** A labelled input with a hint and an error line, both tied to it by aria-describedby. */
function field(id: string, label: string, input: HTMLInputElement | HTMLTextAreaElement, hint: string): Field {
  const error = h("p", { class: "field-error", id: `${id}-error`, hidden: true });
  input.id = id;
  input.setAttribute("aria-describedby", `${id}-hint ${id}-error`);
  return {
    wrap: h("div", { class: "field" }, h("label", { for: id }, label), input, h("p", { class: "hint", id: `${id}-hint` }, hint), error),
    error,
    input,
  };
}

function form(ctx: Ctx, s: WorkspaceSettings, status: HTMLElement): HTMLElement {
  const enabled = h("input", { type: "checkbox", id: "set-tasks", checked: s.tasks_enabled });
  const rate = h("input", { type: "text", inputmode: "decimal", autocomplete: "off", value: s.compute_rate });
  const limit = h("input", { type: "number", min: "1", max: "1440", step: "1", value: s.session_limit_min });
  const heartbeat = h("input", { type: "number", min: "10", max: "86400", step: "1", value: s.heartbeat_timeout_sec });
  const models = h("textarea", { rows: "4", spellcheck: "false" });
  models.value = s.model_allowlist.join("\n");
  const fields: Record<string, Field> = {
    compute_rate: field("set-rate", "Compute rate (per second)", rate, "A decimal of at least 0, at most 6 decimals, in the wallet's currency (0.000100 is 0.36 an hour)."),
    session_limit_min: field("set-limit", "Session limit (minutes)", limit, "1 to 1440. A task run is stopped when it reaches it."),
    heartbeat_timeout_sec: field("set-heartbeat", "Heartbeat timeout (seconds)", heartbeat, "10 to 86400. A run whose agent is silent this long fails."),
    model_allowlist: field("set-models", "Model allowlist", models, "One model id per line; empty allows every model."),
  };
  const save = h("button", { type: "submit", class: "primary" }, "Save settings");
  const f = h(
    "form",
    { class: "settings-form", novalidate: true, "aria-label": "Workspace settings" },
    h("div", { class: "check" }, enabled, h("label", { for: "set-tasks" }, "Enable task runs")),
    Object.values(fields).map((x) => x.wrap),
    h("div", { class: "actions start" }, save),
  );
  f.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    for (const x of Object.values(fields)) {
      x.error.hidden = true;
      x.input.removeAttribute("aria-invalid");
    }
    status.textContent = "";
    const settings = {
      tasks_enabled: enabled.checked,
      compute_rate: rate.value.trim(),
      // Sent as typed (a number when it is one), so that the API names a bad value.
      session_limit_min: numberOr(limit.value),
      heartbeat_timeout_sec: numberOr(heartbeat.value),
      model_allowlist: models.value.split("\n").map((m) => m.trim()).filter((m) => m !== ""),
    };
    save.disabled = true;
    try {
      const ws = await ctx.api.patch<Workspace>(`/workspaces/${encodeURIComponent(ctx.workspace.id)}`, { settings });
      ctx.workspace.settings = ws.settings;
      rate.value = ws.settings.compute_rate;
      status.textContent = "Settings saved.";
    } catch (e) {
      const named = e instanceof ApiError ? String(e.details?.field ?? "") : "";
      const target = fields[named.replace(/^settings\./, "")];
      if (target) {
        target.error.textContent = errorText(e);
        target.error.hidden = false;
        target.input.setAttribute("aria-invalid", "true");
        target.input.focus();
      }
      status.textContent = `Not saved: ${errorText(e)}`;
    } finally {
      save.disabled = false;
    }
  });
  return f;
}

/** The number typed, or the text itself when it is none (the API then says what is wrong). */
function numberOr(v: string): number | string {
  const t = v.trim();
  const n = Number(t);
  return t !== "" && Number.isFinite(n) ? n : t;
}
