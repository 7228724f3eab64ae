"""Fixtures: a real Cella server started for the test session, and sandboxes on it.

The server binary is ``$CELLA_BIN`` (CI sets it to the freshly built ``target/debug/cella``),
else ``/tmp/cella-sdk-py``. It listens on a free port of 127.0.0.1, keeps its state in a
temporary data directory and has a random bootstrap (admin) key. Every sandbox left at the
end is destroyed before the server is stopped (sandboxes outlive their server otherwise).
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional

import httpx
import pytest

import cella
from cella import Sandbox, UnknownRouteError

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

DEFAULT_BIN = "/tmp/cella-sdk-py"
SIZE = "xs"  # the smallest size: every test sandbox is one

# Configurations tried in order: the first the server accepts is used. Servers with a
# pool of pre-booted sandboxes get it turned off; older servers refuse `[pool]`.
CONFIG_CANDIDATES = [
    "[pool]\ndefault = 0\nsizes = {}\n",
    "[pool]\ndefault = 0\n",
    "",
]


@dataclass
class Server:
    url: str
    api_key: str
    data_dir: str
    log_path: str
    process: subprocess.Popen

    def admin(self) -> httpx.Client:
        return httpx.Client(base_url=self.url + "/api/v1", headers={"Authorization": f"Bearer {self.api_key}"}, timeout=60)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_binary() -> str:
    path = os.environ.get("CELLA_BIN") or DEFAULT_BIN
    path = os.path.abspath(path)
    if not os.access(path, os.X_OK):
        pytest.exit(f"no Cella server binary at {path}: set CELLA_BIN to target/debug/cella", returncode=2)
    return path


def start_server(extra_config: str = "", name: str = "cella") -> Server:
    """Start a server on a free port and wait for /healthz."""
    binary = server_binary()
    work = tempfile.mkdtemp(prefix=f"{name}-sdk-test-")
    data_dir = os.path.join(work, "data")
    config_path = os.path.join(work, "config.toml")
    log_path = os.path.join(work, "server.log")
    key = "test-" + secrets.token_hex(16)
    env = dict(os.environ, CELLA_BOOTSTRAP_KEY=key)
    env.pop("CELLA_API_KEY", None)
    last_log = ""
    for candidate in CONFIG_CANDIDATES:
        port = free_port()
        with open(config_path, "w") as f:
            f.write(candidate + extra_config)
        log = open(log_path, "wb")
        proc = subprocess.Popen(
            [binary, "serve", "--listen", f"127.0.0.1:{port}", "--data-dir", data_dir, "--config", config_path],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True,
        )
        log.close()
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                break
            try:
                if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                    return Server(url=url, api_key=key, data_dir=work, log_path=log_path, process=proc)
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        last_log = Path(log_path).read_text(errors="replace")
        if "unknown field" not in last_log:
            break  # not a configuration the server refused: trying another will not help
    shutil.rmtree(work, ignore_errors=True)
    pytest.exit(f"the Cella server ({binary}) did not start:\n{last_log[-3000:]}", returncode=3)
    raise AssertionError("unreachable")


def stop_server(server: Server) -> None:
    """Destroy what is left, stop the server with SIGTERM and remove its data."""
    try:
        with server.admin() as admin:
            cursor = None
            ids: List[str] = []
            while True:
                params = {"limit": 1000}
                if cursor:
                    params["cursor"] = cursor
                page = admin.get("/sandboxes", params=params).json()
                ids += [d["id"] for d in page["data"] if d["state"] != "destroyed"]
                cursor = page.get("next_cursor")
                if not cursor:
                    break
            for sid in ids:
                admin.delete(f"/sandboxes/{sid}")
    except Exception as exc:  # pragma: no cover - best effort
        print(f"cleanup of sandboxes failed: {exc!r}", file=sys.stderr)
    proc = server.process
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if os.environ.get("CELLA_KEEP_TEST_DATA"):
        print(f"server data kept in {server.data_dir}", file=sys.stderr)
    else:
        shutil.rmtree(server.data_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    srv = start_server()
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
        stop_server(srv)


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
