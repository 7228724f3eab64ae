"""Start and stop a real Cella server for tests and examples.

The binary is ``$CELLA_BIN`` (CI sets it to the freshly built ``target/debug/cella``), else
the workspace's ``target/debug/cella``. The server listens on a free port of 127.0.0.1, keeps its state in a
temporary directory and has a random bootstrap (admin) key. :func:`stop_server` destroys
every sandbox left (sandboxes outlive their server otherwise), stops the server with SIGTERM
and removes its directory.

Also a command line: ``python cella_server.py COMMAND...`` runs COMMAND with
``CELLA_SERVER`` and ``CELLA_API_KEY`` set for a server started for it, and exits with
COMMAND's exit code.
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
from dataclasses import dataclass
from pathlib import Path
from typing import List

import httpx

# The workspace's debug build, from the repository root.
DEFAULT_BIN = str(Path(__file__).resolve().parents[3] / "target" / "debug" / "cella")

# Configurations tried in order: the first the server accepts is used. Servers that keep a
# pool of pre-booted sandboxes get it turned off; older servers refuse `[pool]`.
CONFIG_CANDIDATES = [
    "[pool]\ndefault = 0\nsizes = {}\n",
    "[pool]\ndefault = 0\n",
    "",
]


class ServerError(RuntimeError):
    pass


@dataclass
class Server:
    url: str
    api_key: str
    data_dir: str
    log_path: str
    process: "subprocess.Popen[bytes]"

    def admin(self) -> httpx.Client:
        return httpx.Client(base_url=self.url + "/api/v1", headers={"Authorization": f"Bearer {self.api_key}"}, timeout=60)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_binary() -> str:
    path = os.path.abspath(os.environ.get("CELLA_BIN") or DEFAULT_BIN)
    if not os.access(path, os.X_OK):
        raise ServerError(f"no Cella server binary at {path}: set CELLA_BIN to target/debug/cella")
    return path


def start_server(extra_config: str = "", name: str = "cella") -> Server:
    """Start a server on a free port and wait until /healthz answers."""
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
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [binary, "serve", "--listen", f"127.0.0.1:{port}", "--data-dir", data_dir, "--config", config_path],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True,
            )
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
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
            break  # not a configuration the server refused: another will not help
    shutil.rmtree(work, ignore_errors=True)
    raise ServerError(f"the Cella server ({binary}) did not start:\n{last_log[-3000:]}")


def live_sandboxes(server: Server) -> List[str]:
    """Ids of the default workspace's sandboxes that are not destroyed."""
    ids: List[str] = []
    with server.admin() as admin:
        cursor = None
        while True:
            params = {"limit": "1000"}
            if cursor:
                params["cursor"] = cursor
            page = admin.get("/sandboxes", params=params).json()
            ids += [d["id"] for d in page["data"] if d["state"] != "destroyed"]
            cursor = page.get("next_cursor")
            if not cursor:
                return ids


def stop_server(server: Server) -> List[str]:
    """Destroy what is left, stop the server with SIGTERM and remove its data. Answers the
    ids of the sandboxes that were left."""
    left: List[str] = []
    try:
        left = live_sandboxes(server)
        with server.admin() as admin:
            for sid in left:
                admin.delete(f"/sandboxes/{sid}")
        remaining = live_sandboxes(server)
        if remaining:
            print(f"cella_server: could not destroy {remaining}", file=sys.stderr)
    except Exception as exc:  # pragma: no cover - best effort
        print(f"cella_server: cleanup of sandboxes failed: {exc!r}", file=sys.stderr)
    proc = server.process
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if os.environ.get("CELLA_KEEP_TEST_DATA"):
        print(f"cella_server: server data kept in {server.data_dir}", file=sys.stderr)
    else:
        shutil.rmtree(server.data_dir, ignore_errors=True)
    return left


def main(argv: List[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    interrupt_on_sigterm()
    server = start_server(name="cella-run")
    rc = 1
    try:
        env = dict(os.environ, CELLA_SERVER=server.url, CELLA_API_KEY=server.api_key)
        rc = subprocess.call(argv, env=env)
    finally:
        left = stop_server(server)
    if left:
        print(f"cella_server: the command left sandboxes behind: {left}", file=sys.stderr)
        return rc or 1
    return rc


def interrupt_on_sigterm() -> None:
    """Turn SIGTERM (a CI timeout) into KeyboardInterrupt, so that cleanup still runs."""

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, handler)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
