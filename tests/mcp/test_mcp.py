"""Cella's MCP server driven by the official Python SDK (`mcp` from PyPI): over streamable HTTP
(`/mcp`, in the handshake-era protocol with `Mcp-Session-Id` and in the SDK's automatic
negotiation) and over `cella mcp --stdio`."""

from __future__ import annotations

import base64
import json
import os
from contextlib import asynccontextmanager

import anyio
import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from conftest import MAX_SESSIONS_PER_KEY
from cella_server import server_binary

ALL_TOOLS = {
    "sandbox_create", "sandbox_list", "sandbox_destroy", "exec", "file_read", "file_write",
    "file_list", "run_code", "expose_port", "task_start", "task_get", "task_cancel",
}
EXEC_TOOLS = {"exec", "file_write", "run_code"}
TRANSPORTS = ["http-legacy", "http-auto", "stdio"]

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


@asynccontextmanager
async def connect(server, key: str, transport: str):
    if transport == "stdio":
        env = {"CELLA_SERVER": server.url, "CELLA_API_KEY": key, "PATH": os.environ.get("PATH", "")}
        params = StdioServerParameters(command=server_binary(), args=["mcp", "--stdio"], env=env)
        async with Client(params, mode="legacy", read_timeout_seconds=300) as c:
            yield c
        return
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=httpx2.Timeout(300))
    async with http:
        mode = "legacy" if transport == "http-legacy" else "auto"
        async with Client(streamable_http_client(server.url + "/mcp", http_client=http), mode=mode,
                          read_timeout_seconds=300) as c:
            yield c


def text_of(result) -> str:
    return "\n".join(b.text for b in result.content if b.type == "text")


async def call_ok(c, name, args, **kw):
    r = await c.call_tool(name, args, **kw)
    assert not r.is_error, f"{name} failed: {text_of(r)}"
    assert isinstance(r.structured_content, dict), r
    return r


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_whole_session(server, full_key, transport):
    async with connect(server, full_key, transport) as c:
        tools = {t.name: t for t in (await c.list_tools()).tools}
        assert set(tools) == ALL_TOOLS
        for t in tools.values():
            assert t.description and "\n" not in t.description
            assert t.input_schema["type"] == "object" and t.output_schema["type"] == "object"

        sb = (await call_ok(c, "sandbox_create", {"metadata": {"via": "mcp"}})).structured_content["sandbox"]
        sid = sb["id"]
        try:
            assert sb["state"] == "running"
            listed = (await call_ok(c, "sandbox_list", {"state": "running"})).structured_content
            assert sid in [s["id"] for s in listed["sandboxes"]]

            r = await call_ok(c, "exec", {"sandbox_id": sid, "command": "echo hello; echo oops >&2; exit 3"})
            out = r.structured_content
            assert out["exit_code"] == 3 and out["stdout"] == "hello\n" and out["stderr"] == "oops\n"
            assert out["stdout_truncated"] is False and out["timed_out"] is False
            assert "hello" in text_of(r)

            await call_ok(c, "file_write", {"sandbox_id": sid, "path": "/home/user/notes/a.txt",
                                            "content": "héllo from mcp\n"})
            r = await call_ok(c, "file_read", {"sandbox_id": sid, "path": "/home/user/notes/a.txt"})
            assert r.structured_content["content"] == "héllo from mcp\n"
            assert r.structured_content["encoding"] == "utf8" and r.structured_content["truncated"] is False
            raw = bytes(range(256))
            await call_ok(c, "file_write", {"sandbox_id": sid, "path": "/home/user/b.bin",
                                            "content": base64.b64encode(raw).decode(), "encoding": "base64"})
            r = await call_ok(c, "file_read", {"sandbox_id": sid, "path": "/home/user/b.bin"})
            assert r.structured_content["encoding"] == "base64"
            assert base64.b64decode(r.structured_content["content"]) == raw
            entries = (await call_ok(c, "file_list", {"sandbox_id": sid, "path": "/home/user/notes"})).structured_content["entries"]
            assert [(e["name"], e["type"], e["size"]) for e in entries] == [("a.txt", "file", len("héllo from mcp\n".encode()))]

            # The same file as a resource.
            templates = (await c.list_resource_templates()).resource_templates
            assert any(t.uri_template.startswith("cella://sandboxes/") for t in templates)
            uri = f"cella://sandboxes/{sid}/files/home/user/notes/a.txt"
            contents = (await c.read_resource(uri)).contents
            assert contents[0].text == "héllo from mcp\n"
            listed = [str(x.uri) for x in (await c.list_resources()).resources]
            assert f"cella://sandboxes/{sid}/files/home/user/b.bin" in listed

            code = ("import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\n"
                    "plt.plot([1, 2, 3], [1, 4, 9])\nplt.show()\nprint('plotted')\n21 * 2")
            r = await call_ok(c, "run_code", {"sandbox_id": sid, "code": code})
            assert r.structured_content["ok"] is True, r.structured_content
            assert "plotted" in r.structured_content["stdout"] and r.structured_content["result"] == "42"
            images = [b for b in r.content if b.type == "image"]
            assert images and images[0].mime_type == "image/png"
            assert base64.b64decode(images[0].data).startswith(b"\x89PNG\r\n\x1a\n")

            r = await call_ok(c, "expose_port", {"sandbox_id": sid, "port": 8000})
            assert r.structured_content["port"] == 8000 and r.structured_content["url"].startswith("http")
        finally:
            d = (await call_ok(c, "sandbox_destroy", {"sandbox_id": sid})).structured_content["sandbox"]
            assert d["state"] == "destroyed"


@pytest.mark.parametrize("transport", ["http-legacy", "stdio"])
async def test_a_key_without_exec_does_not_see_or_run_exec(server, full_key, no_exec_key, transport):
    async with connect(server, no_exec_key, transport) as c:
        names = {t.name for t in (await c.list_tools()).tools}
        assert names == ALL_TOOLS - EXEC_TOOLS - {"task_start", "task_get", "task_cancel"}
        sid = (await call_ok(c, "sandbox_create", {})).structured_content["sandbox"]["id"]
        try:
            for name, args in [("exec", {"sandbox_id": sid, "command": "touch /home/user/pwned"}),
                               ("file_write", {"sandbox_id": sid, "path": "/home/user/pwned", "content": "x"}),
                               ("run_code", {"sandbox_id": sid, "code": "open('/home/user/pwned','w')"})]:
                r = await c.call_tool(name, args)
                assert r.is_error, name
                assert "FORBIDDEN" in text_of(r) and "sandboxes:exec" in text_of(r)
            # The session goes on, and nothing was written.
            entries = (await call_ok(c, "file_list", {"sandbox_id": sid})).structured_content["entries"]
            assert "pwned" not in [e["name"] for e in entries]
        finally:
            await call_ok(c, "sandbox_destroy", {"sandbox_id": sid})


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_bad_arguments_are_tool_errors_and_the_session_goes_on(server, full_key, transport):
    async with connect(server, full_key, transport) as c:
        bad = [
            ("exec", {"sandbox_id": "sbxnothere"}),                             # missing command
            ("exec", {"sandbox_id": "sbxnothere", "command": "ls", "comand": 1}),  # unknown field
            ("exec", {"sandbox_id": 7, "command": "ls"}),                        # wrong type
            ("exec", {"sandbox_id": "../../api-keys", "command": "ls"}),         # not an id
            ("exec", {"sandbox_id": "sbxnothere", "command": "ls"}),             # no such sandbox
            ("file_read", {"sandbox_id": "sbxnothere", "path": "/etc/passwd"}),
            ("sandbox_create", {"size": "galactic"}),
            ("sandbox_create", {"timeout_sec": -5}),
            ("expose_port", {"sandbox_id": "sbxnothere", "port": 70000}),
            ("file_write", {"sandbox_id": "sbxnothere", "path": "/x", "content": "!!", "encoding": "base64"}),
            ("task_get", {"task_id": "tsknothere"}),
            ("no_such_tool", {}),
        ]
        for name, args in bad:
            r = await c.call_tool(name, args)
            assert r.is_error, (name, args, r)
            assert text_of(r), (name, args)
            assert "INTERNAL" not in text_of(r), (name, args, text_of(r))
        r = await c.call_tool("exec", {"sandbox_id": "sbxnothere", "command": "ls"})
        assert "NOT_FOUND" in text_of(r)
        # Still the same working session.
        assert {t.name for t in (await c.list_tools()).tools} == ALL_TOOLS


async def test_exec_output_is_capped_and_says_so(server, full_key):
    async with connect(server, full_key, "http-legacy") as c:
        sid = (await call_ok(c, "sandbox_create", {})).structured_content["sandbox"]["id"]
        try:
            r = await call_ok(c, "exec", {"sandbox_id": sid, "max_output_bytes": 1000,
                                          "command": "head -c 200000 /dev/zero | tr '\\0' a"})
            out = r.structured_content
            assert out["exit_code"] == 0
            assert out["stdout"] == "a" * 1000 and out["stdout_truncated"] is True
            assert out["stdout_bytes"] == 200000
            assert "cut" in text_of(r)
            r = await call_ok(c, "exec", {"sandbox_id": sid, "command": "sleep 5", "timeout_sec": 1})
            assert r.structured_content["timed_out"] is True
        finally:
            await call_ok(c, "sandbox_destroy", {"sandbox_id": sid})


@pytest.mark.parametrize("transport", ["http-legacy", "stdio"])
async def test_long_calls_report_progress_and_a_cancel_kills_the_command(server, full_key, transport):
    async with connect(server, full_key, transport) as c:
        sid = (await call_ok(c, "sandbox_create", {})).structured_content["sandbox"]["id"]
        try:
            seen = []

            async def progress(p, total, message):
                seen.append((p, message))

            await call_ok(c, "exec", {"sandbox_id": sid, "command": "for i in 1 2 3; do echo $i; sleep 0.7; done"},
                          progress_callback=progress)
            assert seen, "no progress notification arrived"

            # A call given up on (the client sends notifications/cancelled) stops the command.
            with anyio.move_on_after(3):
                await c.call_tool("exec", {"sandbox_id": sid, "command": "sleep 1234; touch /home/user/late"})
            for _ in range(50):
                r = await call_ok(c, "exec", {"sandbox_id": sid, "command": "pgrep -f 'sleep 123[4]' || true"})
                if r.structured_content["stdout"] == "":
                    break
                await anyio.sleep(0.2)
            assert r.structured_content["stdout"] == "", "the cancelled command still runs"
        finally:
            await call_ok(c, "sandbox_destroy", {"sandbox_id": sid})


# Raw HTTP: what the SDKs do not show.

HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}}


def raw_session(server, key: str) -> str:
    r = httpx.post(server.url + "/mcp", json=INIT, headers={**HEADERS, "Authorization": f"Bearer {key}"}, timeout=30)
    assert r.status_code == 200, r.text
    sid = r.headers["mcp-session-id"]
    n = httpx.post(server.url + "/mcp", json={"jsonrpc": "2.0", "method": "notifications/initialized"},
                   headers={**HEADERS, "Authorization": f"Bearer {key}", "Mcp-Session-Id": sid,
                            "MCP-Protocol-Version": "2025-06-18"}, timeout=30)
    assert n.status_code == 202, n.text
    return sid


def raw_list(server, key: str, sid: str) -> httpx.Response:
    return httpx.post(server.url + "/mcp", json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
                      headers={**HEADERS, "Authorization": f"Bearer {key}", "Mcp-Session-Id": sid,
                               "MCP-Protocol-Version": "2025-06-18"}, timeout=30)


def test_no_key_or_a_bad_key_is_401_in_the_api_envelope(server):
    for headers in [HEADERS, {**HEADERS, "Authorization": "Bearer cella_notakey"}, {**HEADERS, "Authorization": "Basic eDp5"}]:
        r = httpx.post(server.url + "/mcp", json=INIT, headers=headers, timeout=30)
        assert r.status_code == 401, r.text
        assert r.json()["error"]["code"] == "UNAUTHORIZED"
        assert r.headers.get("x-request-id")
    r = httpx.get(server.url + "/mcp", headers={"Accept": "text/event-stream"}, timeout=30)
    assert r.status_code == 401 and r.json()["error"]["code"] == "UNAUTHORIZED"


def test_a_session_belongs_to_its_key(server, full_key, no_exec_key):
    sid = raw_session(server, full_key)
    assert raw_list(server, full_key, sid).status_code == 200
    r = raw_list(server, no_exec_key, sid)
    assert r.status_code == 404, r.text
    # Ending it: DELETE, then it is gone.
    d = httpx.delete(server.url + "/mcp", headers={"Authorization": f"Bearer {full_key}", "Mcp-Session-Id": sid,
                                                    "MCP-Protocol-Version": "2025-06-18"}, timeout=30)
    assert d.status_code in (200, 202, 204), d.text
    assert raw_list(server, full_key, sid).status_code == 404


def test_sessions_per_key_are_bounded(server, admin, workspace):
    from conftest import new_key
    key = new_key(admin, workspace, ["sandboxes:read"])
    sids = [raw_session(server, key) for _ in range(MAX_SESSIONS_PER_KEY + 2)]
    alive = [s for s in sids if raw_list(server, key, s).status_code == 200]
    # The newest ones are kept; the oldest were closed to make room.
    assert alive == sids[-MAX_SESSIONS_PER_KEY:], (alive, sids)


def test_tools_list_in_a_raw_session_follows_the_scopes(server, admin, workspace):
    from conftest import new_key
    key = new_key(admin, workspace, ["tasks:read"])
    sid = raw_session(server, key)
    r = raw_list(server, key, sid)
    body = r.text
    if r.headers["content-type"].startswith("text/event-stream"):
        body = next(line[5:] for line in body.splitlines() if line.startswith("data:") and line[5:].strip())
    names = [t["name"] for t in json.loads(body)["result"]["tools"]]
    assert names == ["task_get"]
