// API keys of the workspace: create one with scopes (its secret is shown once, with a copy
// button, and never again: the server keeps only a hash and the list only a prefix), list
// them, and revoke one after a confirmation (it gets 401 from the next request on). Owners and
// admins only: the API answers members 403, so they see a note and no controls.

import { Ctx, isAdmin } from "../api";
import { confirmDialog, errorText, h, mount, table, td, time } from "../ui";
import "./workspace.css";

interface ApiKey {
  id: string;
  name: string;
  scopes: string[];
  prefix: string;
  created_at: string;
  expires_at: string | null;
  last_used_at: string | null;
  key?: string;
}

const SCOPES: [string, string][] = [
  ["sandboxes:read", "read sandboxes, files and processes"],
  ["sandboxes:write", "create, pause, resume and destroy sandboxes"],
  ["sandboxes:exec", "run commands and terminals, write files"],
  ["templates:write", "make custom templates"],
  ["tasks:read", "read task runs"],
  ["tasks:write", "start and stop task runs"],
  ["models:use", "call the model gateway"],
  ["admin", "everything, keys, members and settings included"],
];

export function render(root: HTMLElement, ctx: Ctx): () => void {
  let gone = false;
  const head = h(
    "div",
    { class: "page-head" },
    h("div", null, h("h1", { id: "keys-title" }, "API keys"), h("p", { class: "muted" }, `Keys act in ${ctx.workspace.name} with the scopes they carry.`)),
  );
  if (!isAdmin(ctx.role)) {
    mount(
      root,
      h("section", { class: "ws-page", "aria-labelledby": "keys-title" }, head,
        h("p", { class: "notice ws-note" }, "Only owners and admins can see and manage this workspace's API keys.")),
    );
    return () => {};
  }
  const alert = h("div", { class: "error", role: "alert", hidden: true });
  const status = h("p", { class: "status", role: "status", "aria-live": "polite" });
  const secretBox = h("div", { class: "secret", hidden: true });
  const body = h("div", { class: "panel" }, h("p", { class: "empty" }, "Loading…"));
  const more = h("button", { type: "button", class: "secondary", hidden: true }, "Load more");
  const rows: HTMLTableRowElement[] = [];
  let cursor: string | null = null;

  const fail = (e: unknown) => {
    alert.textContent = errorText(e);
    alert.hidden = false;
  };
  const clear = () => {
    alert.hidden = true;
    status.textContent = "";
  };

  const row = (k: ApiKey): HTMLTableRowElement => {
    const revoke = h("button", { type: "button", class: "secondary small", "aria-label": `Revoke ${k.name}` }, "Revoke");
    const tr = h(
      "tr",
      { "data-key": k.id },
      td("Name", k.name),
      td("Key", h("code", { class: "prefix" }, `${k.prefix}…`)),
      td("Scopes", h("span", { class: "scopes" }, k.scopes.join(", "))),
      td("Created", time(k.created_at)),
      td("Last used", k.last_used_at ? time(k.last_used_at) : "never"),
      td("Expires", k.expires_at ? time(k.expires_at) : "never"),
      td("Actions", h("div", { class: "actions" }, revoke)),
    );
    revoke.addEventListener("click", async () => {
      clear();
      const ok = await confirmDialog({
        title: `Revoke "${k.name}"?`,
        message: `The key ${k.prefix}… stops working at once, for everything that uses it. This cannot be undone.`,
        confirm: "Revoke",
        danger: true,
      });
      if (!ok) return;
      revoke.disabled = true;
      try {
        await ctx.api.del(`/api-keys/${encodeURIComponent(k.id)}`);
        rows.splice(rows.indexOf(tr), 1);
        draw();
        status.textContent = `The key "${k.name}" was revoked.`;
      } catch (e) {
        revoke.disabled = false;
        fail(e);
      }
    });
    return tr;
  };

  const draw = () => {
    if (rows.length === 0) {
      mount(body, h("p", { class: "empty" }, "No keys yet."), more);
      return;
    }
    const tbl = table(["Name", "Key", "Scopes", "Created", "Last used", "Expires", ""], rows, "API keys of this workspace");
    tbl.tHead?.rows[0].cells[6]?.append(h("span", { class: "sr-only" }, "Actions"));
    mount(body, tbl, more);
  };

  const load = async (next: string | null) => {
    try {
      const q = new URLSearchParams({ limit: "100" });
      if (next) q.set("cursor", next);
      const page = await ctx.api.list<ApiKey>(`/api-keys?${q}`);
      if (gone) return;
      if (!next) rows.length = 0;
      rows.push(...page.data.map(row));
      cursor = page.next_cursor;
      more.hidden = !cursor;
      draw();
    } catch (e) {
      if (!gone) fail(e);
    }
  };
  more.addEventListener("click", () => void load(cursor));

  const showSecret = (k: ApiKey) => {
    const input = h("input", { type: "text", id: "new-key", readonly: true, class: "mono", spellcheck: "false", value: k.key ?? "" });
    const copied = h("span", { class: "hint", role: "status", "aria-live": "polite" });
    const copy = h("button", { type: "button", class: "secondary" }, "Copy");
    copy.addEventListener("click", async () => {
      try {
        await navigator.clipboard.writeText(input.value);
      } catch {
        input.select();
        document.execCommand("copy");
      }
      copied.textContent = "Copied.";
    });
    const done = h("button", { type: "button", class: "primary" }, "Done");
    done.addEventListener("click", () => {
      secretBox.hidden = true;
      secretBox.replaceChildren();
      name.focus();
    });
    mount(
      secretBox,
      h("h2", { id: "secret-title" }, `Your new key "${k.name}"`),
      h("p", null, "Copy it now: it is shown only this once. The list keeps only its first characters."),
      h("label", { for: "new-key" }, "New API key"),
      h("div", { class: "copy-row" }, input, copy),
      copied,
      h("div", { class: "actions start" }, done),
    );
    secretBox.hidden = false;
    input.focus();
    input.select();
  };

  const name = h("input", { type: "text", id: "key-name", required: true, maxlength: "200", autocomplete: "off" });
  const expires = h("input", { type: "date", id: "key-expires", "aria-describedby": "key-expires-hint" });
  const boxes = SCOPES.map(([s, what]) => {
    const id = `scope-${s.replace(":", "-")}`;
    const box = h("input", { type: "checkbox", id, value: s });
    return { box, el: h("div", { class: "check" }, box, h("label", { for: id }, h("code", null, s), h("span", { class: "hint-inline" }, ` ${what}`))) };
  });
  const submit = h("button", { type: "submit", class: "primary" }, "Create key");
  const create = h(
    "form",
    { class: "key-form panel", "aria-labelledby": "create-title", novalidate: true },
    h("h2", { id: "create-title" }, "Create a key"),
    h("div", { class: "field" }, h("label", { for: "key-name" }, "Name"), name),
    h("fieldset", null, h("legend", null, "Scopes"), boxes.map((b) => b.el)),
    h("div", { class: "field" }, h("label", { for: "key-expires" }, "Expires (optional)"), expires,
      h("p", { class: "hint", id: "key-expires-hint" }, "The key stops working at the end of that day (UTC). Empty: it does not expire.")),
    h("div", { class: "actions start" }, submit),
  );
  create.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    clear();
    const scopes = boxes.filter((b) => b.box.checked).map((b) => b.box.value);
    if (!name.value.trim()) {
      fail("Give the key a name.");
      name.focus();
      return;
    }
    if (scopes.length === 0) {
      fail("Pick at least one scope.");
      boxes[0]?.box.focus();
      return;
    }
    const req: Record<string, unknown> = { workspace_id: ctx.workspace.id, name: name.value.trim(), scopes };
    if (expires.value) req.expires_at = `${expires.value}T23:59:59Z`;
    submit.disabled = true;
    try {
      const k = await ctx.api.post<ApiKey>("/api-keys", req);
      showSecret(k);
      rows.push(row({ ...k, key: undefined }));
      draw();
      name.value = "";
      expires.value = "";
      for (const b of boxes) b.box.checked = false;
    } catch (e) {
      fail(e);
    } finally {
      submit.disabled = false;
    }
  });

  mount(
    root,
    h(
      "section",
      { class: "ws-page", "aria-labelledby": "keys-title" },
      head,
      secretBox,
      alert,
      status,
      h("h2", null, "Keys"),
      body,
      create,
    ),
  );
  void load(null);
  return () => {
    gone = true;
  };
}
