"""Pieces that need no server: the event-stream decoder, times, outputs."""

from __future__ import annotations

import base64
from datetime import datetime, timedelta, timezone

import pytest

from cella._sse import KEEPALIVE, LineSplitter, SSEDecoder, SSEEvent, output_bytes
from cella.models import Execution, Output, parse_time


def decode(chunks):
    lines, dec, out = LineSplitter(), SSEDecoder(), []
    for chunk in chunks:
        for line in lines.feed(chunk):
            ev = dec.feed(line)
            if ev is not None:
                out.append(ev)
    for line in lines.flush():
        ev = dec.feed(line)
        if ev is not None:
            out.append(ev)
    last = dec.flush()
    if last is not None:
        out.append(last)
    return out


def test_sse_split_anywhere() -> None:
    stream = b'event: stdout\ndata: "a\\n"\n\n:\n\nevent: exit\r\ndata: {"exit_code":0}\r\n\r\n'
    whole = decode([stream])
    bytewise = decode([stream[i:i + 1] for i in range(len(stream))])
    assert whole == bytewise
    assert whole[0] == SSEEvent("stdout", '"a\\n"') and whole[1] is KEEPALIVE
    assert whole[2].event == "exit" and whole[2].json() == {"exit_code": 0}


def test_sse_multiline_data_and_unterminated_end() -> None:
    evs = decode([b"data: one\ndata: two\n\nevent: x\ndata: tail"])
    assert evs == [SSEEvent("message", "one\ntwo"), SSEEvent("x", "tail")]


def test_output_bytes() -> None:
    assert output_bytes("héllo") == "héllo".encode()
    assert output_bytes({"b64": base64.b64encode(b"\xff\x00").decode()}) == b"\xff\x00"


def test_parse_time() -> None:
    assert parse_time("2026-11-29T08:00:00.123Z") == datetime(2026, 11, 29, 8, 0, 0, 123000, tzinfo=timezone.utc)
    assert parse_time("2026-11-29T08:00:00Z").tzinfo == timezone.utc
    assert parse_time("2026-11-29T10:00:00+02:00") == datetime(2026, 11, 29, 8, 0, tzinfo=timezone.utc)
    assert parse_time("2026-11-29T08:00:00.5-01:30").utcoffset() == -timedelta(hours=1, minutes=30)
    assert parse_time(None) is None
    with pytest.raises(ValueError):
        parse_time("yesterday")


def test_outputs() -> None:
    png = b"\x89PNG\r\n\x1a\nxx"
    ex = Execution.from_dict({"ok": True, "outputs": [
        {"mime": "image/png", "data": base64.b64encode(png).decode()},
        {"mime": "text/html", "data": "<b>x</b>"},
    ]})
    assert ex.png == png and ex.html == "<b>x</b>" and ex.json is None and ex.svg is None
    assert Output("text/html", "é").bytes == "é".encode() and Output("image/png", "").is_binary


class _DroppingServer:
    """An HTTP server that answers the first request of each connection, keeps the
    connection open without `Connection: close`, and drops it unanswered when the next
    request comes: what a server does when it closes a kept-alive connection late."""

    def __init__(self) -> None:
        import socket
        import threading

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = "http://127.0.0.1:%d" % self.sock.getsockname()[1]
        self.answered: list = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _read_request(self, conn) -> bytes:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return b""
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        while len(rest) < length:
            rest += conn.recv(65536)
        return head.split(b"\r\n")[0]

    def _serve(self) -> None:
        import threading

        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._connection, args=(conn,), daemon=True).start()

    def _connection(self, conn) -> None:
        with conn:
            line = self._read_request(conn)
            if not line:
                return
            self.answered.append(line.decode())
            body = b'{"data": {"id": "sbfake", "state": "running"}}'
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
            conn.recv(65536)  # the next request on this connection: dropped unanswered

    def close(self) -> None:
        self.sock.close()


def test_request_on_a_dropped_connection_is_sent_again() -> None:
    from cella import Sandbox

    srv = _DroppingServer()
    try:
        sb = Sandbox.connect("sbfake", server=srv.url, api_key="k")  # GET: answered
        assert sb.refresh().state == "running"  # GET on the kept connection: dropped, sent again
        assert sb.pause().state == "running"  # POST that failed at once: sent again
        assert srv.answered == ["GET /api/v1/sandboxes/sbfake HTTP/1.1"] * 2 + ["POST /api/v1/sandboxes/sbfake/pause HTTP/1.1"]
        sb.close()
    finally:
        srv.close()


def test_async_request_on_a_dropped_connection_is_sent_again() -> None:
    import asyncio

    from cella import AsyncSandbox

    srv = _DroppingServer()

    async def main() -> None:
        sb = await AsyncSandbox.connect("sbfake", server=srv.url, api_key="k")
        assert (await sb.refresh()).state == "running"
        assert (await sb.kill()).state == "running"
        await sb.close()

    try:
        asyncio.run(main())
        assert len(srv.answered) == 3
    finally:
        srv.close()


def test_money_fields_are_exact_decimals() -> None:
    from decimal import Decimal

    from cella.models import SandboxInfo, parse_money

    info = SandboxInfo.from_dict(
        {"id": "sb1", "state": "running", "compute_rate": "0.000100", "compute_cost": "0.006000", "model_cost": "0.000000"}
    )
    assert info.compute_rate == Decimal("0.0001") and isinstance(info.compute_rate, Decimal)
    assert info.compute_cost == Decimal("0.006") and info.model_cost == 0
    # an older server without the fields: 0
    assert SandboxInfo.from_dict({"id": "sb2", "state": "running"}).compute_cost == 0
    assert parse_money("-1.500000") == Decimal("-1.5")
    for bad in (0.1, "abc"):
        try:
            parse_money(bad)
        except ValueError:
            pass
        else:
            raise AssertionError(bad)


def test_task_models_from_the_documented_objects() -> None:
    from decimal import Decimal

    from cella import GoneError, TaskEvent, TaskInfo, Wallet
    from cella.errors import error_from_body

    t = TaskInfo.from_dict({
        "id": "task1", "workspace_id": "ws1", "created_by": "key1", "repository": "acme/web",
        "base_branch": "main", "branch": "cella/task1", "forge": "github", "agent": "builtin",
        "state": "stopped", "failure_reason": None, "stop_reason": "agent_exit",
        "pull_request": {"number": 12, "url": "https://example.org/acme/web/pull/12", "draft": True},
        "queued_at": "2026-12-01T18:00:00Z", "started_at": "2026-12-01T18:00:02Z", "ended_at": "2026-12-01T18:01:00Z",
        "compute_sec": 42, "compute_rate": "0.001000", "compute_cost": "0.060000",
        "model_cost": "0.006000", "model_requests": 5, "session_limit_min": 60, "metadata": {"ticket": "WEB-12"},
    })
    assert t.finished and t.ok and t.pull_request is not None and t.pull_request.number == 12
    assert t.compute_cost == Decimal("0.060000") and t.model_cost + t.compute_cost == Decimal("0.066")
    assert t.metadata == {"ticket": "WEB-12"} and t.ended_at is not None
    ev = TaskEvent.from_sse("state", {"event": "state", "state": "failed", "at": "2026-12-01T18:00:03Z",
                                      "failure_reason": "agent_exit: exit code 3", "stop_reason": "agent_exit"})
    assert ev.finished and ev.failure_reason.startswith("agent_exit")
    progress = TaskEvent.from_sse("progress", {"event": "progress", "steps": 4, "commits": 1, "files_changed": 1})
    assert not progress.finished and (progress.steps, progress.commits, progress.files_changed) == (4, 1, 1)
    w = Wallet.from_dict({"balance": "12.500000", "reserved": "0.100000", "available": "12.400000", "currency": "USD"})
    assert w.balance - w.reserved == w.available
    gone = error_from_body(410, b'{"error": {"code": "GONE", "message": "the run has ended", "details": null}}')
    assert isinstance(gone, GoneError) and gone.status == 410
