// Small DOM helpers: `h()` builds elements, plus badges, formatting, a confirm dialog, toasts.

type Child = Node | string | number | null | undefined | false | Child[];
type Attrs = Record<string, unknown> & { on?: Record<string, (ev: any) => void> };

/** `h("button", {class: "primary", on: {click}}, "Start")`. Attributes with `false`, `null` or
 *  `undefined` are left out; `true` sets an empty attribute. Text is always text, never HTML. */
export function h<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attrs?: Attrs | null,
  ...children: Child[]
): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag);
  if (attrs) {
    for (const [k, v] of Object.entries(attrs)) {
      if (k === "on") {
        for (const [ev, fn] of Object.entries(v as Record<string, (e: Event) => void>)) el.addEventListener(ev, fn);
      } else if (v === false || v === null || v === undefined) {
        continue;
      } else if (k === "value" && "value" in el) {
        (el as unknown as HTMLInputElement).value = String(v);
      } else {
        el.setAttribute(k, v === true ? "" : String(v));
      }
    }
  }
  append(el, children);
  return el;
}

function append(el: Node, children: Child[]): void {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else el.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

/** Replaces an element's children. */
export function mount(el: Element, ...children: Child[]): void {
  el.replaceChildren();
  append(el, children);
}

const TERMINAL = new Set(["stopped", "failed", "cancelled", "destroyed", "error"]);
export function isTerminal(state: string): boolean {
  return TERMINAL.has(state);
}

/** A state word as the API names it, coloured by what it means. */
export function badge(state: string): HTMLElement {
  const tone =
    state === "running" || state === "ready"
      ? "ok"
      : state === "failed" || state === "error"
        ? "bad"
        : state === "queued" || state === "provisioning" || state === "paused"
          ? "wait"
          : "done";
  return h("span", { class: `badge ${tone}`, "data-state": state }, state);
}

/** An exact decimal string of the API (`"0.060000"`) for people: `0.06 USD`, keeping every
 *  significant digit (never through a float). */
export function money(amount: string | null | undefined, currency = "USD"): string {
  if (amount === null || amount === undefined || amount === "") return "—";
  let s = String(amount);
  const neg = s.startsWith("-");
  if (neg) s = s.slice(1);
  let [whole, frac = ""] = s.split(".");
  frac = frac.replace(/0+$/, "");
  if (frac.length < 2) frac = frac.padEnd(2, "0");
  whole = whole.replace(/\B(?=(\d{3})+(?!\d))/g, ",");
  return `${neg ? "−" : ""}${whole}.${frac} ${currency}`;
}

/** Seconds for people: `42 s`, `3 min 5 s`, `2 h 10 min`. */
export function duration(sec: number | null | undefined): string {
  if (sec === null || sec === undefined || !isFinite(sec)) return "—";
  const s = Math.max(0, Math.round(sec));
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min${s % 60 ? ` ${s % 60} s` : ""}`;
  const m = Math.floor((s % 3600) / 60);
  if (s < 86400) return `${Math.floor(s / 3600)} h${m ? ` ${m} min` : ""}`;
  return `${Math.floor(s / 86400)} d ${Math.floor((s % 86400) / 3600)} h`;
}

/** How long ago an RFC 3339 time was: `5 min ago`. */
export function ago(at: string | null | undefined): string {
  if (!at) return "—";
  const t = Date.parse(at);
  if (isNaN(t)) return "—";
  const s = (Date.now() - t) / 1000;
  if (s < 10) return "just now";
  return `${duration(s).split(" ").slice(0, 2).join(" ")} ago`;
}

/** A time as the reader's clock shows it, with the full time as a tooltip. */
export function time(at: string | null | undefined): HTMLElement | string {
  if (!at) return "—";
  const d = new Date(at);
  if (isNaN(d.getTime())) return "—";
  return h(
    "time",
    { datetime: at, title: d.toISOString() },
    d.toLocaleString(undefined, { dateStyle: "medium", timeStyle: "short" }),
  );
}

/** A modal question: resolves true when the person confirms. Esc or Cancel: false. */
export function confirmDialog(opts: {
  title: string;
  message: string;
  confirm: string;
  danger?: boolean;
}): Promise<boolean> {
  return new Promise((resolve) => {
    const titleId = `dlg-${Math.random().toString(36).slice(2)}`;
    const cancel = h("button", { type: "button", class: "secondary" }, "Cancel");
    const ok = h("button", { type: "submit", class: opts.danger ? "danger" : "primary" }, opts.confirm);
    const dlg = h(
      "dialog",
      { class: "confirm", "aria-labelledby": titleId, role: "alertdialog" },
      h(
        "form",
        { method: "dialog" },
        h("h2", { id: titleId }, opts.title),
        h("p", null, opts.message),
        h("div", { class: "actions" }, cancel, ok),
      ),
    );
    let answer = false;
    cancel.addEventListener("click", () => dlg.close());
    ok.addEventListener("click", () => {
      answer = true;
    });
    dlg.addEventListener("close", () => {
      dlg.remove();
      resolve(answer);
    });
    document.body.appendChild(dlg);
    trapFocus(dlg);
    dlg.showModal();
    cancel.focus();
  });
}

/** A short message in the corner (role=status, or alert for errors). */
export function toast(message: string, kind: "info" | "error" = "info"): void {
  let box = document.getElementById("toasts");
  if (!box) {
    box = h("div", { id: "toasts", class: "toasts" });
    document.body.appendChild(box);
  }
  const t = h("div", { class: `toast ${kind}`, role: kind === "error" ? "alert" : "status" }, message);
  box.appendChild(t);
  setTimeout(() => t.remove(), kind === "error" ? 8000 : 4000);
}

/** A labelled table that turns into cards on a narrow screen (each cell shows its column's
 *  name, from `data-label`). */
export function table(columns: string[], rows: HTMLTableRowElement[], caption?: string): HTMLTableElement {
  return h(
    "table",
    { class: "grid" },
    caption ? h("caption", { class: "sr-only" }, caption) : null,
    h("thead", null, h("tr", null, columns.map((c) => h("th", { scope: "col" }, c)))),
    h("tbody", null, rows),
  );
}

/** A cell with its column's name for the narrow layout. */
export function td(label: string, ...children: Child[]): HTMLTableCellElement {
  return h("td", { "data-label": label }, ...children);
}

/** A message for an error of the API or the network. */
export function errorText(e: unknown): string {
  if (e && typeof e === "object" && "message" in e) return String((e as Error).message);
  return String(e);
}

/** Keeps Tab and Shift+Tab inside a modal dialog (Esc closes it, as every `<dialog>` does). */
export function trapFocus(dlg: HTMLDialogElement): void {
  dlg.addEventListener("keydown", (ev) => {
    if (ev.key !== "Tab") return;
    const items = Array.from(
      dlg.querySelectorAll<HTMLElement>("a[href], button, input, select, textarea, [tabindex]:not([tabindex='-1'])"),
    ).filter((el) => !el.hasAttribute("disabled") && !el.hidden && el.offsetParent !== null);
    if (items.length === 0) return;
    const first = items[0];
    const last = items[items.length - 1];
    if (ev.shiftKey && document.activeElement === first) {
      ev.preventDefault();
      last.focus();
    } else if (!ev.shiftKey && document.activeElement === last) {
      ev.preventDefault();
      first.focus();
    }
  });
}
