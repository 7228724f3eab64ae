// The API client: the public API only, with the session cookie. Every write carries the
// session's CSRF token (`x-csrf-token`); every request names the selected workspace with
// `x-cella-workspace`. `EventSource` and `WebSocket` cannot send headers, so the selected
// workspace is also kept in the `cella_workspace` cookie, which the server reads when no header
// names one.

export type Role = "owner" | "admin" | "member" | "operator";

export interface User {
  id: string;
  email: string;
  name: string;
  created_at: string;
}

export interface WorkspaceSettings {
  tasks_enabled: boolean;
  compute_rate: string;
  session_limit_min: number;
  heartbeat_timeout_sec: number;
  model_allowlist: string[];
  [key: string]: unknown;
}

export interface Workspace {
  id: string;
  name: string;
  kind: "personal" | "organization";
  plan?: string;
  created_at?: string;
  currency?: string;
  settings: WorkspaceSettings;
}

export interface Me {
  user: User;
  workspaces: { workspace: Workspace; role: Role }[];
  csrf_token: string;
}

export interface Page<T> {
  data: T[];
  next_cursor: string | null;
}

/** An error answer of the API, from its envelope `{"error": {code, message, details}}`. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
    readonly details: Record<string, unknown> | null,
  ) {
    super(message);
    this.name = "ApiError";
  }
}

export interface SseHandlers {
  /** Called per event name (`state`, `progress`, `output`, ...) with the parsed JSON data. */
  [event: string]: ((data: any) => void) | undefined;
}

const BASE = "/api/v1";

function url(path: string): string {
  return path.startsWith("/api/") ? path : BASE + path;
}

export class Api {
  csrf = "";
  workspace = "";
  /** Called when an answer says the session ended (401). */
  onSignedOut: () => void = () => {};

  /** Selects the workspace every later request acts in (header, and cookie for streams). */
  select(workspaceId: string): void {
    this.workspace = workspaceId;
    document.cookie = `cella_workspace=${encodeURIComponent(workspaceId)}; Path=/; SameSite=Strict`;
  }

  async request<T = any>(method: string, path: string, body?: unknown): Promise<T> {
    const headers: Record<string, string> = { accept: "application/json" };
    if (body !== undefined) headers["content-type"] = "application/json";
    if (method !== "GET" && method !== "HEAD") headers["x-csrf-token"] = this.csrf;
    if (this.workspace) headers["x-cella-workspace"] = this.workspace;
    let res: Response;
    try {
      res = await fetch(url(path), {
        method,
        headers,
        credentials: "same-origin",
        body: body === undefined ? undefined : JSON.stringify(body),
      });
    } catch (e) {
      throw new ApiError(0, "NETWORK", "The server could not be reached. Check your connection and try again.", null);
    }
    const text = await res.text();
    let json: any = null;
    if (text) {
      try {
        json = JSON.parse(text);
      } catch {
        json = null;
      }
    }
    if (!res.ok) {
      const err = json && typeof json === "object" && json.error ? json.error : null;
      const e = new ApiError(
        res.status,
        err?.code ?? `HTTP_${res.status}`,
        err?.message ?? `The server answered ${res.status}.`,
        err?.details ?? null,
      );
      if (res.status === 401 && path !== "/sessions") this.onSignedOut();
      throw e;
    }
    return json as T;
  }

  /** GET: the `data` of the answer. */
  async get<T = any>(path: string): Promise<T> {
    return (await this.request<{ data: T }>("GET", path)).data;
  }
  /** GET of a list: `{data, next_cursor}`. */
  async list<T = any>(path: string): Promise<Page<T>> {
    return this.request<Page<T>>("GET", path);
  }
  async post<T = any>(path: string, body?: unknown): Promise<T> {
    return (await this.request<{ data: T }>("POST", path, body ?? {})).data;
  }
  async patch<T = any>(path: string, body?: unknown): Promise<T> {
    return (await this.request<{ data: T }>("PATCH", path, body ?? {})).data;
  }
  async del<T = any>(path: string): Promise<T> {
    return (await this.request<{ data: T }>("DELETE", path)).data;
  }

  /** Opens a server-sent event stream (same origin: the cookies go with it). Returns `close`.
   *  `onEnd` is called once when the stream ends (the server closed it, or it failed) and
   *  the browser would otherwise reconnect. */
  sse(path: string, handlers: SseHandlers, onEnd?: () => void): () => void {
    const es = new EventSource(url(path), { withCredentials: true });
    let closed = false;
    const close = () => {
      if (!closed) {
        closed = true;
        es.close();
      }
    };
    for (const name of Object.keys(handlers)) {
      es.addEventListener(name, (ev) => {
        const fn = handlers[name];
        if (!fn) return;
        const raw = (ev as MessageEvent).data;
        let data: unknown = raw;
        try {
          data = JSON.parse(raw);
        } catch {
          /* not JSON: pass the text */
        }
        fn(data);
      });
    }
    es.onerror = () => {
      // A stream the server ended (a terminal run), or one refused (410 after a run): do not
      // let the browser retry it every few seconds.
      close();
      onEnd?.();
    };
    return close;
  }

  /** The WebSocket address of an API path on this origin. */
  wsUrl(path: string): string {
    const proto = location.protocol === "https:" ? "wss:" : "ws:";
    return `${proto}//${location.host}${url(path)}`;
  }
}

/** What every page gets. */
export interface Ctx {
  api: Api;
  me: Me;
  workspace: Workspace;
  role: Role;
  /** The parts of the hash after the page's name: `#/tasks/abc` gives `["abc"]`. */
  params: string[];
  navigate(hash: string): void;
  /** Reads `/me` again (after a change of settings, a role, ...) and renders the page anew. */
  refresh(): Promise<void>;
}

export type Render = (root: HTMLElement, ctx: Ctx) => void | (() => void);

export function isAdmin(role: Role): boolean {
  return role === "owner" || role === "admin" || role === "operator";
}
