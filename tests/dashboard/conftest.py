"""Fixtures of the dashboard's browser suite: a real Cella server (the binary of $CELLA_BIN)
with a `git` forge over local bare repositories, the built-in agent driven by a stand-in model
(standin_coder.py), command agents, an owner with a personal and an organization workspace, and
Playwright for Python driving Debian's chromium (browsers cannot be downloaded here).

Screenshots go to $DASHBOARD_SCREENSHOTS (default: target/dashboard-screenshots of the
repository)."""

from __future__ import annotations

import os
from contextlib import closing
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
for p in (HERE, REPO / "sdk" / "python" / "tests"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from cella_server import Server, ServerError, interrupt_on_sigterm, start_server, stop_server  # noqa: E402
from standin_coder import KEY, MODEL, StandInCoder  # noqa: E402

interrupt_on_sigterm()

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
SHOTS = Path(os.environ.get("DASHBOARD_SCREENSHOTS") or REPO / "target" / "dashboard-screenshots")
PASSWORD = "correct horse battery"
OWNER = ("olive@example.org", "Olive Owner")
MEMBER = ("max@example.org", "Max Member")
REPOSITORY = "acme/web"
# Per second: a run's compute cost shows (the 60-second minimum is 0.06).
RATE = "0.001000"
expect.set_options(timeout=30_000)


def git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=test", "-c", "user.email=test@example.org", *args],
                   cwd=cwd, check=True, capture_output=True)


def make_repo(root: Path, repository: str) -> None:
    work = Path(tempfile.mkdtemp(prefix="dash-repo-"))
    git(work, "init", "-q", "-b", "main")
    (work / "README.md").write_text("# web\n")
    git(work, "add", "-A")
    git(work, "commit", "-q", "-m", "The first commit")
    bare = root / f"{repository}.git"
    bare.parent.mkdir(parents=True, exist_ok=True)
    git(root, "clone", "-q", "--bare", str(work), str(bare))


def config(standin: StandInCoder, repos: Path) -> str:
    return f"""
[auth]
failures_per_email = 100

[gateway]
reserve_per_run = "0.100000"

[[gateway.upstreams]]
name = "standin"
kind = "openai"
base_url = "{standin.url}/v1"
api_key = "{KEY}"
models = ["{MODEL}"]

[gateway.prices."{MODEL}"]
input = "0.500000"
output = "1.500000"

[tasks]
runners = 4
heartbeat_interval_sec = 1
grace_sec = 2

[[forges]]
name = "local"
kind = "git"
url_template = "{repos}/{{repository}}.git"

[[agents]]
name = "builtin"
kind = "builtin"
template = "base"
max_steps = 6
model = "{MODEL}"

[[agents]]
name = "sleeper"
kind = "command"
command = ["bash", "-c", "echo sleeping; sleep 600"]

[[agents]]
name = "quick"
kind = "command"
command = ["true"]
"""


class Env:
    """The server and what the fixtures made in it."""

    def __init__(self, server: Server, repos: Path) -> None:
        self.server = server
        self.url = server.url
        self.repos = repos
        self.admin = server.admin()
        self.owner_personal = ""
        self.org = ""

    def session(self, email: str) -> httpx.Client:
        """An API client signed in as `email` (the cookie and the CSRF token set)."""
        c = httpx.Client(base_url=self.url + "/api/v1", timeout=60)
        r = c.post("/sessions", json={"email": email, "password": PASSWORD})
        assert r.status_code == 201, r.text
        c.headers["x-csrf-token"] = r.json()["data"]["csrf_token"]
        return c


@pytest.fixture(scope="session")
def env() -> Iterator[Env]:
    standin = StandInCoder()
    repos = Path(tempfile.mkdtemp(prefix="dash-repos-"))
    make_repo(repos, REPOSITORY)
    try:
        srv = start_server(config(standin, repos), name="cella-dash")
    except ServerError as exc:
        pytest.exit(str(exc), returncode=3)
        raise
    e = Env(srv, repos)
    try:
        a = e.admin
        for email, name in (OWNER, MEMBER):
            r = a.post("/users", json={"email": email, "name": name, "password": PASSWORD})
            assert r.status_code == 201, r.text
        with closing(e.session(OWNER[0])) as s:
            me = s.get("/me").json()["data"]
            e.owner_personal = next(w["workspace"]["id"] for w in me["workspaces"] if w["workspace"]["kind"] == "personal")
        r = a.post("/workspaces", json={"name": "Acme", "plan": "developer", "kind": "organization"})
        assert r.status_code == 201, r.text
        e.org = r.json()["data"]["id"]
        # The owner of the personal workspace becomes the organization's owner too; a member joins.
        for email, role in ((OWNER[0], "owner"), (MEMBER[0], "member")):
            r = a.post(f"/workspaces/{e.org}/members", json={"email": email, "role": role})
            assert r.status_code in (200, 201), r.text
        # Money in the personal workspace, so runs there cost something visible.
        r = a.post(f"/workspaces/{e.owner_personal}/wallet/credits", json={"amount": "25.000000", "reference": "dashboard tests"})
        assert r.status_code in (200, 201), r.text
        yield e
    finally:
        for email in (OWNER[0], MEMBER[0]):
            try:
                cleanup(e, email)
            except Exception as exc:  # pragma: no cover - best effort
                print(f"cleanup for {email} failed: {exc!r}", file=sys.stderr)
        e.admin.close()
        stop_server(srv)
        standin.stop()
        subprocess.run(["rm", "-rf", str(repos)], check=False)


def cleanup(e: Env, email: str) -> None:
    """Cancel the runs and destroy the sandboxes the user's workspaces still have."""
    with closing(e.session(email)) as s:
        me = s.get("/me").json()["data"]
        for w in me["workspaces"]:
            h = {"x-cella-workspace": w["workspace"]["id"]}
            if w["role"] != "member":
                for t in s.get("/tasks", params={"limit": 1000}, headers=h).json().get("data", []):
                    if t["state"] not in ("stopped", "failed", "cancelled"):
                        s.post(f"/tasks/{t['id']}/cancel", headers=h)
            for sb in s.get("/sandboxes", params={"limit": 1000}, headers=h).json().get("data", []):
                if sb["state"] != "destroyed":
                    s.delete(f"/sandboxes/{sb['id']}", headers=h)


@pytest.fixture(scope="session")
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                              args=["--no-sandbox", "--disable-dev-shm-usage"])
        yield b
        b.close()


def new_page(browser: Browser, width: int = 1280, height: int = 800) -> Page:
    ctx = browser.new_context(viewport={"width": width, "height": height})
    page = ctx.new_page()
    errors: list = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" and "Content Security Policy" in m.text else None)
    page.js_errors = errors  # type: ignore[attr-defined]
    return page


def sign_in(page: Page, env: Env, email: str = OWNER[0]) -> None:
    page.goto(env.url + "/")
    page.get_by_label("Email").fill(email)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("navigation").get_by_role("link", name="Task runs")).to_be_visible()


def set_settings(env: Env, workspace: str, **settings) -> None:
    """Changes a workspace's settings as its owner (through the API)."""
    with closing(env.session(OWNER[0])) as s:
        r = s.patch(f"/workspaces/{workspace}", json={"settings": settings}, headers={"x-cella-workspace": workspace})
        assert r.status_code == 200, r.text


def choose_workspace(page: Page, workspace_id: str) -> None:
    page.get_by_label("Workspace").select_option(workspace_id)


def shot(page: Page, name: str) -> Path:
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=False)
    return path


@pytest.fixture()
def owner_page(browser: Browser, env: Env) -> Iterator[Page]:
    page = new_page(browser)
    sign_in(page, env)
    yield page
    assert not page.js_errors, page.js_errors  # type: ignore[attr-defined]
    page.context.close()
