"""Fixtures: the stand-in model server (standin.py; this machine reaches no model provider),
and a real Cella server whose gateway points at it (started with sdk/python's helper)."""

from __future__ import annotations

import io
import os
import site
import socket
import sys
import tarfile
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
from standin import ANTHROPIC_KEY, StandIn  # noqa: E402

interrupt_on_sigterm()

# Per million tokens. The models of the functional tests are free (a workspace with an empty
# wallet may use them); the priced ones are metered: gpt-priced, 21 in and 9 out, costs
# 21 × 2.5 + 9 × 10 = 142.5 → 143 micro-units; claude-priced (17 + 3 cached) × 3 + 8 × 15 = 180.
PRICES = {
    "gpt-test": ("0", "0"),
    "gpt-priced": ("2.500000", "10.000000"),
    "claude-priced": ("3.000000", "15.000000"),
    "gpt-test-bad": ("0", "0"),
    "gpt-test-die": ("0", "0"),
    "gpt-other": ("0", "0"),
    "gpt-down": ("0", "0"),
    "claude-test": ("0", "0"),
    "claude-test-bad": ("0", "0"),
    "claude-test-die": ("0", "0"),
}


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gateway_config(standin: StandIn) -> str:
    prices = "".join(
        f'[gateway.prices."{m}"]\ninput = "{i}"\noutput = "{o}"\n' for m, (i, o) in PRICES.items()
    )
    return f"""
[gateway]
reserve_per_run = "0.500000"

[[gateway.upstreams]]
name = "standin-openai"
kind = "openai"
base_url = "{standin.url}/v1"
api_key_env = "STANDIN_OPENAI_KEY"
models = ["gpt-test", "gpt-priced", "gpt-test-bad", "gpt-test-die", "gpt-other"]

[[gateway.upstreams]]
name = "standin-anthropic"
kind = "anthropic"
base_url = "{standin.url}"
api_key = "{ANTHROPIC_KEY}"
models = ["claude-test", "claude-priced", "claude-test-bad", "claude-test-die"]

[[gateway.upstreams]]
name = "down"
kind = "openai"
base_url = "http://127.0.0.1:{closed_port()}/v1"
models = ["gpt-down"]

{prices}"""


@pytest.fixture(scope="session")
def standin() -> Iterator[StandIn]:
    s = StandIn()
    yield s
    s.stop()


@pytest.fixture(scope="session")
def server(standin: StandIn) -> Iterator[Server]:
    from standin import OPENAI_KEY

    os.environ["STANDIN_OPENAI_KEY"] = OPENAI_KEY
    for k in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL",
              "HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY"):
        os.environ.pop(k, None)
    try:
        srv = start_server(gateway_config(standin), name="cella-gw")
    except ServerError as exc:
        pytest.exit(str(exc), returncode=3)
        raise
    try:
        yield srv
    finally:
        stop_server(srv)


@pytest.fixture(scope="session")
def admin(server: Server) -> Iterator[httpx.Client]:
    with server.admin() as c:
        yield c


@pytest.fixture(scope="session")
def workspace(admin: httpx.Client) -> str:
    """A workspace of its own for these tests."""
    r = admin.post("/workspaces", json={"name": "gateway-tests", "plan": "developer", "kind": "organization"})
    assert r.status_code == 201, r.text
    return r.json()["data"]["id"]


def new_key(admin: httpx.Client, workspace: str, scopes) -> str:
    r = admin.post("/api-keys", json={"workspace_id": workspace, "name": "gw", "scopes": scopes})
    assert r.status_code == 201, r.text
    return r.json()["data"]["key"]


@pytest.fixture(scope="session")
def models_key(admin: httpx.Client, workspace: str) -> str:
    return new_key(admin, workspace, ["models:use"])


@pytest.fixture(scope="session")
def sandbox_key(admin: httpx.Client, workspace: str) -> str:
    return new_key(admin, workspace, ["sandboxes:read", "sandboxes:write", "sandboxes:exec"])


@pytest.fixture(scope="session")
def packages_tar() -> bytes:
    """The virtualenv's site-packages (openai, anthropic and their dependencies) as a tar.gz,
    for a sandbox's python (the host's /usr/bin/python3, which the virtualenv was made from)."""
    buf = io.BytesIO()
    sp = Path(site.getsitepackages()[0])
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name in sorted(os.listdir(sp)):
            if name.startswith(("pip", "_pytest", "pytest", "setuptools", "__pycache__")):
                continue
            tar.add(sp / name, arcname=f"site/{name}",
                    filter=lambda ti: None if "__pycache__" in ti.name else ti)
    return buf.getvalue()
