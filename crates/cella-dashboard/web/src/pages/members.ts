// Members: who belongs to the workspace, with which role. Owners and admins invite an existing
// user by email with a role, change roles and remove people; only an owner (or the operator)
// makes or changes an owner, so an admin sees owners' rows without controls. The API keeps
// the last owner (409 CONFLICT), and its answer is shown as it says. Members see the list.

import { ApiError, Ctx, isAdmin } from "../api";
import { confirmDialog, errorText, h, mount, table, td } from "../ui";
import "./workspace.css";

interface Member {
  user_id: string;
  email: string;
  name: string;
  role: "owner" | "admin" | "member";
}

const ROLES = ["member", "admin", "owner"] as const;

/** The API's answer as a sentence; a 409 (the last owner, a member already) says nothing changed. */
function explain(e: unknown): string {
  let text = errorText(e);
  if (!/[.!?]$/.test(text)) text += ".";
  if (e instanceof ApiError && e.status === 409) return `Not changed: ${text}`;
  return text.charAt(0).toUpperCase() + text.slice(1);
}

export function render(root: HTMLElement, ctx: Ctx): () => void {
  let gone = false;
  const manage = isAdmin(ctx.role);
  const owner = ctx.role === "owner" || ctx.role === "operator";
  const personal = ctx.workspace.kind === "personal";
  const base = `/workspaces/${encodeURIComponent(ctx.workspace.id)}/members`;
  const alert = h("div", { class: "error", role: "alert", hidden: true });
  const status = h("p", { class: "status", role: "status", "aria-live": "polite" });
  const rows: HTMLTableRowElement[] = [];
  const body = h("div", { class: "panel" }, h("p", { class: "empty" }, "Loading…"));
  const more = h("button", { type: "button", class: "secondary", hidden: true }, "Load more");
  let cursor: string | null = null;

  const fail = (e: unknown) => {
    alert.textContent = explain(e);
    alert.hidden = false;
  };
  const clear = () => {
    alert.hidden = true;
    alert.textContent = "";
    status.textContent = "";
  };
  // Only an owner offers "owner" (an admin's choice of it would be refused).
  const roleOptions = (current: string) =>
    ROLES.filter((r) => owner || r !== "owner" || current === "owner").map((r) =>
      h("option", { value: r, selected: r === current }, r),
    );

  const row = (m: Member): HTMLTableRowElement => {
    const locked = m.role === "owner" && !owner;
    const cells = [td("Name", m.name), td("Email", m.email)];
    if (manage && !personal) {
      // Choosing a role changes nothing yet (a keyboard walks through the options); `Save`
      // sends it.
      const sel = h("select", { "aria-label": `Role of ${m.email}`, disabled: locked }, roleOptions(m.role));
      const save = h("button", { type: "button", class: "primary small", "aria-label": `Save the role of ${m.email}`, hidden: true }, "Save");
      sel.addEventListener("change", () => {
        save.hidden = sel.value === m.role;
      });
      save.addEventListener("click", async () => {
        clear();
        const before = m.role;
        sel.disabled = true;
        save.disabled = true;
        try {
          const upd = await ctx.api.patch<Member>(`${base}/${encodeURIComponent(m.user_id)}`, { role: sel.value });
          m.role = upd.role;
          status.textContent = `${m.email} is now ${upd.role}.`;
          // A change of one's own role changes what this page may show.
          if (m.user_id === ctx.me.user.id) await ctx.refresh();
        } catch (e) {
          sel.value = before;
          fail(e);
        } finally {
          sel.disabled = m.role === "owner" && !owner;
          save.disabled = false;
          save.hidden = true;
          if (!sel.disabled) sel.focus();
        }
      });
      const self = m.user_id === ctx.me.user.id;
      const remove = h(
        "button",
        { type: "button", class: "secondary small", "aria-label": `${self ? "Leave as" : "Remove"} ${m.email}`, disabled: locked },
        self ? "Leave" : "Remove",
      );
      remove.addEventListener("click", async () => {
        clear();
        const ok = await confirmDialog(
          self
            ? { title: "Leave this workspace?", message: `You lose access to ${ctx.workspace.name}.`, confirm: "Leave", danger: true }
            : { title: `Remove ${m.name}?`, message: `${m.email} loses access to ${ctx.workspace.name}.`, confirm: "Remove", danger: true },
        );
        if (!ok) return;
        try {
          await ctx.api.del(`${base}/${encodeURIComponent(m.user_id)}`);
          tr.remove();
          status.textContent = `${m.email} was removed.`;
          if (self) await ctx.refresh();
        } catch (e) {
          fail(e);
        }
      });
      cells.push(td("Role", h("div", { class: "role-pick" }, sel, save)), td("Actions", h("div", { class: "actions" }, remove)));
    } else {
      cells.push(td("Role", m.role));
    }
    const tr = h("tr", { "data-member": m.email }, cells);
    return tr;
  };

  const draw = () => {
    const cols = manage && !personal ? ["Name", "Email", "Role", ""] : ["Name", "Email", "Role"];
    const tbl = table(cols, rows, "Members of this workspace");
    const last = tbl.tHead?.rows[0].cells[3];
    if (last) last.append(h("span", { class: "sr-only" }, "Actions"));
    mount(body, tbl, more);
  };

  const load = async (next: string | null) => {
    try {
      const q = new URLSearchParams({ limit: "100" });
      if (next) q.set("cursor", next);
      const page = await ctx.api.list<Member>(`${base}?${q}`);
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

  const invite = () => {
    const email = h("input", { type: "email", id: "invite-email", required: true, autocomplete: "off" });
    const role = h("select", { id: "invite-role" }, roleOptions("member"));
    const submit = h("button", { type: "submit", class: "primary" }, "Invite");
    const f = h(
      "form",
      { class: "inline-form panel", "aria-labelledby": "invite-title", novalidate: true },
      h("h2", { id: "invite-title" }, "Invite someone"),
      h("div", { class: "row" },
        h("div", { class: "field grow" }, h("label", { for: "invite-email" }, "Email"), email),
        h("div", { class: "field" }, h("label", { for: "invite-role" }, "Role"), role),
        h("div", { class: "field" }, submit)),
      h("p", { class: "hint" }, "They need an account on this server already; they see this workspace when they next sign in or reload."),
    );
    f.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      clear();
      if (!email.value.trim()) {
        fail("Enter the email of the person to invite.");
        email.focus();
        return;
      }
      submit.disabled = true;
      try {
        const m = await ctx.api.post<Member>(base, { email: email.value.trim(), role: role.value });
        rows.push(row(m));
        draw();
        status.textContent = `${m.email} was added as ${m.role}.`;
        email.value = "";
      } catch (e) {
        fail(e);
        email.focus();
      } finally {
        submit.disabled = false;
      }
    });
    return f;
  };

  mount(
    root,
    h(
      "section",
      { class: "ws-page", "aria-labelledby": "members-title" },
      h("div", { class: "page-head" }, h("div", null, h("h1", { id: "members-title" }, "Members"), h("p", { class: "muted" }, `People in ${ctx.workspace.name}.`))),
      personal ? h("p", { class: "notice ws-note" }, "A personal workspace has only you. Invite people to an organization workspace.") : null,
      !manage ? h("p", { class: "notice ws-note" }, "Only owners and admins can invite people and change roles.") : null,
      manage && !personal ? invite() : null,
      alert,
      status,
      body,
    ),
  );
  void load(null);
  return () => {
    gone = true;
  };
}
