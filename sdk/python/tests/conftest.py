"""Fixtures: a real Cella server started for the test session (see cella_server.py), and
sandboxes on it."""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional

import httpx
import pytest

import cella
from cella import Sandbox, UnknownRouteError

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from cella_server import Server, ServerError, interrupt_on_sigterm, stop_server  # noqa: E402
from cella_server import start_server as _start_server  # noqa: E402

SIZE = "xs"  # the smallest size: every test sandbox is one

# The session's server has a command agent for the README's task run (no model needed): it
# adds the task's text to README.md and commits. Its repositories are those of the embedded
# `git` forge, under DATA_DIR/repos (test_readme.py makes acme/web there).
AGENT_SCRIPT = 'echo "$CELLA_TASK" >> README.md && git -c user.name=agent -c user.email=agent@example.org commit -qam Greet'
SESSION_CONFIG = (
    "[tasks]\nheartbeat_interval_sec = 1\ngrace_sec = 2\n\n"
    '[[agents]]\nname = "greeter"\nkind = "command"\n'
    f"command = [\"bash\", \"-c\", '''{AGENT_SCRIPT}''']\n"
)

interrupt_on_sigterm()


def start_server(extra_config: str = "", name: str = "cella") -> Server:
    try:
        return _start_server(extra_config, name)
    except ServerError as exc:
        pytest.exit(str(exc), returncode=3)
        raise


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    srv = start_server(SESSION_CONFIG)
    saved = {k: os.environ.get(k) for k in ("CELLA_SERVER", "CELLA_API_KEY")}
    # The SDK finds the server through the environment, as a user's program would.
    os.environ["CELLA_SERVER"] = srv.url
    os.environ["CELLA_API_KEY"] = srv.api_key
    try:
        yield srv
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        left = stop_server(srv)
        assert not left, f"the tests left sandboxes behind: {left}"


@pytest.fixture(scope="session")
def admin(server: Server) -> Iterator[httpx.Client]:
    with server.admin() as client:
        yield client


@pytest.fixture(scope="session")
def workspace_id(admin: httpx.Client) -> str:
    return _default_workspace(admin)


def _default_workspace(admin: httpx.Client) -> str:
    for ws in admin.get("/workspaces").json()["data"]:
        if ws["name"] == "default":
            return ws["id"]
    raise AssertionError("no default workspace")


@pytest.fixture(scope="session")
def make_key(admin: httpx.Client, workspace_id: str) -> Callable[..., Dict[str, str]]:
    """Make an API key (of the default workspace unless told) with the scopes given."""

    def make(scopes: List[str], workspace: Optional[str] = None) -> Dict[str, str]:
        r = admin.post("/api-keys", json={"workspace_id": workspace or workspace_id, "name": "sdk-test", "scopes": scopes})
        assert r.status_code == 201, r.text
        return r.json()["data"]

    return make


@pytest.fixture
def tag() -> str:
    """A metadata value unique to the test, to find its own sandboxes in lists."""
    return uuid.uuid4().hex[:12]


@pytest.fixture
def sandbox(server: Server) -> Iterator[Sandbox]:
    """A fresh running sandbox, destroyed after the test."""
    sb = Sandbox.create(size=SIZE, timeout=600)
    try:
        yield sb
    finally:
        try:
            sb.kill()
        finally:
            sb.close()


@pytest.fixture(scope="module")
def shared(server: Server) -> Iterator[Sandbox]:
    """One running sandbox for the tests of a module that leave its state as it was."""
    sb = Sandbox.create(size=SIZE, timeout=1800, metadata={"fixture": "shared"})
    try:
        yield sb
    finally:
        try:
            sb.kill()
        finally:
            sb.close()


def ghost(sandbox_id: str = "sb000000000000000000") -> Sandbox:
    """A handle on a sandbox that does not exist (for the 404 of every route)."""
    from cella._transport import SyncTransport

    return Sandbox(cella.SandboxInfo.from_dict({"id": sandbox_id, "state": "running"}), SyncTransport(cella.ConnectionConfig.resolve()))


def skip_if_route_missing(exc: BaseException, route: str) -> None:
    """Skip when the server answered 404 because it has no such route (not built yet); any
    other error is left to fail the test."""
    if isinstance(exc, UnknownRouteError):
        pytest.skip(f"{route}: the server does not serve this route yet ({exc})")
