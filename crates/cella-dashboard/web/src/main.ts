// The dashboard's shell: sign-in and sign-out, the navigation, the workspace switcher and the
// hash router (`#/tasks`, `#/tasks/{id}`, `#/sandboxes`, ...). Pages are modules with
// `render(root, ctx)`, which may return a function called when the page is left.

import "./style.css";
import { Api, ApiError, Ctx, Me, Render, Role, Workspace } from "./api";
import { errorText, h, mount, toast } from "./ui";
import * as tasks from "./pages/tasks";
import * as task from "./pages/task";
import * as sandboxes from "./pages/sandboxes";
import * as settings from "./pages/settings";
import * as members from "./pages/members";
import * as keys from "./pages/keys";
import * as wallet from "./pages/wallet";

// The pages, by the first part of the hash. One line per page.
const routes: Record<string, Render> = {
  tasks: (root, ctx) => (ctx.params.length ? task.render(root, ctx) : tasks.render(root, ctx)),
  sandboxes: sandboxes.render,
  settings: settings.render,
  members: members.render,
  keys: keys.render,
  wallet: wallet.render,
};

// The navigation, in order: [hash name, accessible name].
const NAV: [string, string][] = [
  ["tasks", "Task runs"],
  ["sandboxes", "Sandboxes"],
  ["settings", "Settings"],
  ["members", "Members"],
  ["keys", "API keys"],
  ["wallet", "Wallet"],
];

const api = new Api();
const app = document.getElementById("app") as HTMLElement;
const STORE_KEY = "cella.workspace";

let me: Me | null = null;
let leave: (() => void) | void = undefined;
let main: HTMLElement | null = null;

function parseHash(): { page: string; params: string[] } {
  const parts = location.hash.replace(/^#\/?/, "").split("/").filter(Boolean).map(decodeURIComponent);
  return { page: parts[0] || "tasks", params: parts.slice(1) };
}

function navigate(hash: string): void {
  const want = hash.startsWith("#") ? hash : `#${hash}`;
  if (location.hash === want) render();
  else location.hash = want;
}

function current(): { workspace: Workspace; role: Role } | null {
  if (!me || me.workspaces.length === 0) return null;
  const saved = localStorage.getItem(STORE_KEY);
  return (
    me.workspaces.find((w) => w.workspace.id === saved) ??
    me.workspaces.find((w) => w.workspace.kind === "personal") ??
    me.workspaces[0]
  );
}

async function loadMe(): Promise<boolean> {
  try {
    me = await api.get<Me>("/me");
    api.csrf = me.csrf_token;
    return true;
  } catch (e) {
    if (e instanceof ApiError && e.status === 401) {
      me = null;
      return false;
    }
    throw e;
  }
}

function signInPage(message?: string): void {
  leave?.();
  leave = undefined;
  main = null;
  const email = h("input", { id: "email", name: "email", type: "email", autocomplete: "username", required: true });
  const password = h("input", {
    id: "password",
    name: "password",
    type: "password",
    autocomplete: "current-password",
    required: true,
  });
  const error = h("p", { class: "error", role: "alert", hidden: !message }, message ?? "");
  const button = h("button", { type: "submit", class: "primary" }, "Sign in");
  const form = h(
    "form",
    { class: "signin card", "aria-labelledby": "signin-title" },
    h("h1", { id: "signin-title" }, h("span", { class: "logo", "aria-hidden": "true" }, "◆"), " Cella"),
    h("p", { class: "muted" }, "Sign in to your workspace."),
    h("label", { for: "email" }, "Email"),
    email,
    h("label", { for: "password" }, "Password"),
    password,
    error,
    button,
  );
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    button.disabled = true;
    error.hidden = true;
    try {
      await api.request("POST", "/sessions", { email: email.value, password: password.value });
      await loadMe();
      if (!location.hash || location.hash === "#/signin") location.hash = "#/tasks";
      shell();
    } catch (e) {
      error.textContent =
        e instanceof ApiError && e.status === 401
          ? "Wrong email or password."
          : e instanceof ApiError && e.status === 429
            ? "Too many failed sign-ins. Wait a minute and try again."
            : errorText(e);
      error.hidden = false;
      button.disabled = false;
      password.select();
    }
  });
  mount(app, h("main", { class: "signin-page" }, form));
  document.title = "Sign in · Cella";
  email.focus();
}

async function signOut(): Promise<void> {
  try {
    await api.request("DELETE", "/sessions/current");
  } catch {
    /* the session may have ended already */
  }
  document.cookie = "cella_workspace=; Path=/; Max-Age=0; SameSite=Strict";
  me = null;
  signInPage();
}

function shell(): void {
  const cur = current();
  if (!me || !cur) {
    signInPage();
    return;
  }
  api.select(cur.workspace.id);
  const select = h(
    "select",
    { id: "workspace", name: "workspace" },
    me.workspaces.map((w) =>
      h(
        "option",
        { value: w.workspace.id, selected: w.workspace.id === cur.workspace.id },
        `${w.workspace.name}${w.workspace.kind === "personal" ? " (personal)" : ""}`,
      ),
    ),
  );
  select.addEventListener("change", () => {
    localStorage.setItem(STORE_KEY, select.value);
    api.select(select.value);
    // Another workspace's run or sandbox is not there: go to its list.
    const { page } = parseHash();
    location.hash = `#/${page}`;
    render();
  });
  const nav = h(
    "nav",
    { "aria-label": "Main" },
    h(
      "ul",
      null,
      NAV.map(([key, name]) => h("li", null, h("a", { href: `#/${key}`, "data-page": key }, name))),
    ),
  );
  main = h("main", { id: "main", tabindex: "-1" });
  mount(
    app,
    h("a", { class: "skip", href: "#main", on: { click: (e: Event) => { e.preventDefault(); main?.focus(); } } }, "Skip to content"),
    h(
      "header",
      { class: "top" },
      h("a", { class: "brand", href: "#/tasks" }, h("span", { class: "logo", "aria-hidden": "true" }, "◆"), "Cella"),
      h("div", { class: "switcher" }, h("label", { for: "workspace" }, "Workspace"), select),
      h(
        "div",
        { class: "who" },
        h("span", { class: "user", title: me.user.email }, me.user.name),
        h("button", { type: "button", class: "secondary small", on: { click: signOut } }, "Sign out"),
      ),
    ),
    h("div", { class: "layout" }, nav, main),
  );
  render();
}

function render(): void {
  if (!me || !main) return;
  const cur = current();
  if (!cur) return;
  leave?.();
  leave = undefined;
  const { page, params } = parseHash();
  for (const a of app.querySelectorAll<HTMLAnchorElement>("nav a")) {
    if (a.dataset.page === page) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  const fn = routes[page];
  const root = h("div", { class: "page" });
  main.replaceChildren(root);
  const title = NAV.find(([k]) => k === page)?.[1] ?? "Not found";
  document.title = `${title} · ${cur.workspace.name} · Cella`;
  if (!fn) {
    mount(root, h("h1", null, "Not found"), h("p", null, h("a", { href: "#/tasks" }, "Go to the task runs")));
    return;
  }
  const ctx: Ctx = {
    api,
    me,
    workspace: cur.workspace,
    role: cur.role,
    params,
    navigate,
    refresh: async () => {
      await loadMe();
      shell();
    },
  };
  try {
    leave = fn(root, ctx);
  } catch (e) {
    mount(root, h("p", { class: "error", role: "alert" }, errorText(e)));
  }
}

api.onSignedOut = () => {
  if (me) {
    me = null;
    signInPage("Your session ended. Sign in again.");
  }
};

window.addEventListener("hashchange", () => {
  if (me) render();
});

async function boot(): Promise<void> {
  try {
    if (await loadMe()) shell();
    else signInPage();
  } catch (e) {
    mount(app, h("main", { class: "signin-page" }, h("p", { class: "error", role: "alert" }, errorText(e))));
    toast(errorText(e), "error");
  }
}

void boot();
