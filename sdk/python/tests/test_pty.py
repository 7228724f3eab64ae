"""The terminal (``sandbox.pty``): a program on a pseudo-terminal over a WebSocket."""

from __future__ import annotations

import asyncio

import pytest

from conftest import Server, ghost

from cella import AsyncSandbox, NotFoundError, PermissionDeniedError, Sandbox, SandboxNotRunningError
from cella.pty import _Decoder, encode_frame, parse_frame


def test_frames_round_trip() -> None:
    for size in (0, 5, 125, 126, 65535, 65536, 70000):
        payload = bytes(i % 251 for i in range(size))
        frame = encode_frame(0x2, payload)
        fin, op, got, used = parse_frame(frame)  # type: ignore[misc]
        assert (fin, op, got, used) == (True, 0x2, payload, len(frame))
        assert parse_frame(frame[:-1] if size else frame[:1]) is None


def test_decoder_output_exit_and_fragments() -> None:
    def server_frame(op: int, payload: bytes, fin: bool = True) -> bytes:  # unmasked, as servers send
        return bytes([(0x80 if fin else 0) | op, len(payload)]) + payload

    d = _Decoder()
    stream = server_frame(0x2, b"he", fin=False) + server_frame(0x0, b"llo") + server_frame(0x1, b'{"exit": {"exit_code": 3}}')
    out, replies = d.feed(stream[:3])
    assert out == [] and replies == []
    out, replies = d.feed(stream[3:] + server_frame(0x9, b"p") + server_frame(0x8, b"\x03\xe8"))
    assert out == [b"hello"] and d.exit_code == 3 and d.closed
    assert [parse_frame(r)[1] for r in replies] == [0xA, 0x8]  # type: ignore[index]


def test_terminal_runs_a_program(shared: Sandbox) -> None:
    with shared.pty.create(cols=100, rows=30, command="stty size; read line; echo got:$line; exit 7") as term:
        term.send("hello\n")
        out = term.read_all(timeout=60).decode("utf-8", "replace")
    assert "30 100" in out and "got:hello" in out, out
    assert term.exit_code == 7


def test_terminal_resize_and_shell(shared: Sandbox) -> None:
    term = shared.pty.create()
    try:
        term.resize(120, 40)
        term.send("stty size; exit\n")
        out = term.read_all(timeout=60).decode("utf-8", "replace")
    finally:
        term.close()
    assert "40 120" in out, out
    assert term.exit_code == 0


def test_terminal_errors(server: Server, sandbox: Sandbox, make_key) -> None:
    with pytest.raises(NotFoundError):
        ghost().pty.create()
    reader = make_key(["sandboxes:read"])
    other = Sandbox.connect(sandbox.id, api_key=reader["key"])
    try:
        with pytest.raises(PermissionDeniedError):
            other.pty.create()
    finally:
        other.close()  # closes the connection only; the fixture destroys the sandbox
    sandbox.pause()
    with pytest.raises(SandboxNotRunningError):
        sandbox.pty.create()


def test_async_terminal(shared: Sandbox) -> None:
    async def main() -> None:
        sb = await AsyncSandbox.connect(shared.id)
        try:
            async with await sb.pty.create(command="read x; echo async:$x") as term:
                await term.send("yes\r")
                out = await term.read_all(timeout=60)
            assert b"async:yes" in out and term.exit_code == 0
        finally:
            await sb.close()

    asyncio.run(main())
