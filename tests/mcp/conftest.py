"""Fixtures: a real Cella server (started with sdk/python's helper), a workspace of its own, and
keys with and without `sandboxes:exec`; the MCP clients are the official `mcp` package's."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Iterator

import httpx
import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
for p in (HERE, REPO / "sdk" / "python" / "tests"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from cella_server import Server, ServerError, interrupt_on_sigterm, start_server, stop_server  # noqa: E402

interrupt_on_sigterm()

# Small limits, so the tests can see them hold.
MAX_SESSIONS_PER_KEY = 3
CONFIG = f"""
[mcp]
max_sessions_per_key = {MAX_SESSIONS_PER_KEY}
session_idle_sec = 600
"""


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    for k in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY"):
        os.environ.pop(k, None)
    try:
        srv = start_server(CONFIG, name="cella-mcp")
    except ServerError as exc:
        pytest.exit(str(exc), returncode=3)
        raise
    try:
        yield srv
    finally:
        left = stop_server(srv)
        assert not left, f"sandboxes left running: {left}"


@pytest.fixture(scope="session")
def admin(server: Server) -> Iterator[httpx.Client]:
    with server.admin() as c:
        yield c


@pytest.fixture(scope="session")
def workspace(admin: httpx.Client) -> str:
    r = admin.post("/workspaces", json={"name": "mcp-tests", "plan": "developer", "kind": "organization"})
    assert r.status_code == 201, r.text
    return r.json()["data"]["id"]


def new_key(admin: httpx.Client, workspace: str, scopes) -> str:
    r = admin.post("/api-keys", json={"workspace_id": workspace, "name": "mcp", "scopes": scopes})
    assert r.status_code == 201, r.text
    return r.json()["data"]["key"]


@pytest.fixture(scope="session")
def full_key(admin: httpx.Client, workspace: str) -> str:
    return new_key(admin, workspace, ["sandboxes:read", "sandboxes:write", "sandboxes:exec",
                                      "tasks:read", "tasks:write"])


@pytest.fixture(scope="session")
def no_exec_key(admin: httpx.Client, workspace: str) -> str:
    return new_key(admin, workspace, ["sandboxes:read", "sandboxes:write"])
