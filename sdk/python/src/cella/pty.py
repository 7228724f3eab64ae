"""Interactive terminals (``GET /api/v1/sandboxes/{id}/pty``): a program on a new
pseudo-terminal in the sandbox, over a WebSocket.

The WebSocket client is a small one of this SDK's own (RFC 6455, standard library only):
binary frames carry the terminal's bytes both ways, a text frame ``{"resize": {...}}`` resizes
it, and the server's last text frame ``{"exit": {"exit_code": N}}`` says how the program
ended::

    with sandbox.pty.create(command="python3 -q") as term:
        term.send("print(6 * 7)\\nexit()\\n")
        print(term.read_all().decode(), term.exit_code)
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import ssl
import struct
import time
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Tuple, Union
from urllib.parse import urlencode, urlsplit

from ._common import sandbox_path
from ._config import ConnectionConfig
from ._transport import _headers
from .errors import CellaConnectionError, CellaTimeoutError, error_from_body

if TYPE_CHECKING:  # pragma: no cover
    from .async_sandbox import AsyncSandbox
    from .sandbox import Sandbox

__all__ = ["Pty", "PtyHandle", "AsyncPty", "AsyncPtyHandle"]

OP_CONT, OP_TEXT, OP_BIN, OP_CLOSE, OP_PING, OP_PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA
CONNECT_TIMEOUT = 30.0


def encode_frame(opcode: int, payload: bytes) -> bytes:
    """A client frame: final, masked (as RFC 6455 wants from clients)."""
    head = bytes([0x80 | opcode])
    n = len(payload)
    if n < 126:
        head += bytes([0x80 | n])
    elif n < 1 << 16:
        head += bytes([0x80 | 126]) + struct.pack("!H", n)
    else:
        head += bytes([0x80 | 127]) + struct.pack("!Q", n)
    mask = os.urandom(4)
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def parse_frame(buf: bytes) -> Optional[Tuple[bool, int, bytes, int]]:
    """(fin, opcode, payload, bytes used) of the first whole frame in ``buf``, or None."""
    if len(buf) < 2:
        return None
    fin, opcode = bool(buf[0] & 0x80), buf[0] & 0x0F
    masked, n = bool(buf[1] & 0x80), buf[1] & 0x7F
    i = 2
    if n == 126:
        if len(buf) < 4:
            return None
        n, i = struct.unpack("!H", buf[2:4])[0], 4
    elif n == 127:
        if len(buf) < 10:
            return None
        n, i = struct.unpack("!Q", buf[2:10])[0], 10
    mask = b""
    if masked:
        if len(buf) < i + 4:
            return None
        mask, i = buf[i:i + 4], i + 4
    if len(buf) < i + n:
        return None
    payload = buf[i:i + n]
    if masked:
        payload = bytes(b ^ mask[j % 4] for j, b in enumerate(payload))
    return fin, opcode, payload, i + n


def _request(config: ConnectionConfig, sandbox_id: str, params: Dict[str, Any]) -> Tuple[str, int, bool, bytes, str]:
    """(host, port, tls, the upgrade request's bytes, its Sec-WebSocket-Key)."""
    url = urlsplit(config.api_url + sandbox_path(sandbox_id, "pty"))
    tls = url.scheme == "https"
    host = url.hostname or "127.0.0.1"
    port = url.port or (443 if tls else 80)
    query = urlencode({k: v for k, v in params.items() if v is not None})
    key = base64.b64encode(os.urandom(16)).decode()
    headers = _headers(config)
    headers.pop("Accept", None)
    lines = [f"GET {url.path}{'?' + query if query else ''} HTTP/1.1", f"Host: {url.netloc}",
             "Connection: Upgrade", "Upgrade: websocket", "Sec-WebSocket-Version: 13", f"Sec-WebSocket-Key: {key}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return host, port, tls, ("\r\n".join(lines) + "\r\n\r\n").encode(), key


def _split_head(buf: bytes) -> Optional[Tuple[int, Dict[str, str], bytes]]:
    """(status, headers, the bytes after the head) once the whole head is in ``buf``."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        return None
    head = buf[:end].decode("latin-1").split("\r\n")
    try:
        status = int(head[0].split()[1])
    except (IndexError, ValueError):
        raise CellaConnectionError(f"not an HTTP answer: {head[0]!r}") from None
    hdrs = {}
    for line in head[1:]:
        k, _, v = line.partition(":")
        hdrs[k.strip().lower()] = v.strip()
    return status, hdrs, buf[end + 4:]


def _params(cols: Optional[int], rows: Optional[int], command: Optional[str], user: Optional[str], cwd: Optional[str]) -> Dict[str, Any]:
    return {"cols": cols, "rows": rows, "command": command, "user": user, "cwd": cwd}


class _Decoder:
    """Turns the server's frames into output bytes and the exit code."""

    def __init__(self) -> None:
        self.buf = b""
        self.exit_code: Optional[int] = None
        self.closed = False
        self._fragments: List[bytes] = []
        self._fragment_op = 0

    def feed(self, data: bytes) -> Tuple[List[bytes], List[bytes]]:
        """(output chunks, frames to send back: pongs, the close answer)."""
        self.buf += data
        out: List[bytes] = []
        replies: List[bytes] = []
        while True:
            frame = parse_frame(self.buf)
            if frame is None:
                return out, replies
            fin, op, payload, used = frame
            self.buf = self.buf[used:]
            if op == OP_CONT:
                self._fragments.append(payload)
                if not fin:
                    continue
                op, payload = self._fragment_op, b"".join(self._fragments)
                self._fragments = []
            elif op in (OP_TEXT, OP_BIN) and not fin:
                self._fragment_op, self._fragments = op, [payload]
                continue
            if op == OP_BIN:
                out.append(payload)
            elif op == OP_TEXT:
                try:
                    msg = json.loads(payload.decode("utf-8"))
                except ValueError:
                    msg = None
                if isinstance(msg, dict) and isinstance(msg.get("exit"), dict):
                    self.exit_code = int(msg["exit"].get("exit_code", -1))
                else:
                    out.append(payload)
            elif op == OP_PING:
                replies.append(encode_frame(OP_PONG, payload))
            elif op == OP_CLOSE:
                if not self.closed:
                    replies.append(encode_frame(OP_CLOSE, payload[:2]))
                self.closed = True
                return out, replies


def _resize_frame(cols: int, rows: int) -> bytes:
    return encode_frame(OP_TEXT, json.dumps({"resize": {"cols": int(cols), "rows": int(rows)}}).encode())


def _input_frame(data: Union[str, bytes]) -> bytes:
    return encode_frame(OP_BIN, data.encode("utf-8") if isinstance(data, str) else bytes(data))


class PtyHandle:
    """An open terminal: :meth:`send` keys, :meth:`resize`, iterate (or :meth:`read`) its
    output; :attr:`exit_code` once the program has ended (None when the socket closed without
    saying)."""

    def __init__(self, sock: socket.socket, rest: bytes) -> None:
        self._sock = sock
        self._dec = _Decoder()
        self._pending: List[bytes] = []
        self._eof = False
        if rest:
            self._take(rest)

    @property
    def exit_code(self) -> Optional[int]:
        return self._dec.exit_code

    @property
    def closed(self) -> bool:
        return self._eof

    def _take(self, data: bytes) -> None:
        out, replies = self._dec.feed(data)
        self._pending += out
        for r in replies:
            try:
                self._sock.sendall(r)
            except OSError:
                pass
        if self._dec.closed:
            self._eof = True

    def send(self, data: Union[str, bytes]) -> None:
        """Type ``data`` (text as UTF-8, or bytes) into the terminal."""
        self._sock.sendall(_input_frame(data))

    def resize(self, cols: int, rows: int) -> None:
        self._sock.sendall(_resize_frame(cols, rows))

    def read(self, timeout: Optional[float] = None) -> Optional[bytes]:
        """The next piece of output; b"" when the terminal has closed; None when nothing came
        within ``timeout`` seconds."""
        while not self._pending:
            if self._eof:
                return b""
            self._sock.settimeout(timeout)
            try:
                data = self._sock.recv(65536)
            except socket.timeout:
                return None
            except OSError as exc:
                raise CellaConnectionError(f"the terminal's connection broke: {exc!r}") from exc
            if not data:
                self._eof = True
            else:
                self._take(data)
        return self._pending.pop(0)

    def __iter__(self) -> Iterator[bytes]:
        while True:
            chunk = self.read()
            if not chunk:
                return
            yield chunk

    def read_all(self, timeout: Optional[float] = 60.0) -> bytes:
        """Everything until the program ends and the terminal closes;
        :class:`~cella.CellaTimeoutError` after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        out = bytearray()
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise CellaTimeoutError(f"the terminal was still open after {timeout} s")
            chunk = self.read(left)
            if chunk is None:
                continue
            if chunk == b"":
                return bytes(out)
            out += chunk

    def wait(self, timeout: Optional[float] = 60.0) -> Optional[int]:
        """Read until the end; answers :attr:`exit_code`."""
        self.read_all(timeout)
        return self.exit_code

    def close(self) -> None:
        """Close the socket (the program is hung up if it still runs)."""
        if self._sock.fileno() < 0:
            return
        try:
            if not self._eof:
                self._sock.sendall(encode_frame(OP_CLOSE, struct.pack("!H", 1000)))
        except OSError:
            pass
        self._eof = True
        self._sock.close()

    def __enter__(self) -> "PtyHandle":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Pty:
    """``sandbox.pty``: open terminals in a sandbox."""

    def __init__(self, sandbox: "Sandbox") -> None:
        self._sandbox = sandbox

    def create(self, cols: Optional[int] = None, rows: Optional[int] = None, *, command: Optional[str] = None,
               user: Optional[str] = None, cwd: Optional[str] = None, timeout: float = CONNECT_TIMEOUT) -> PtyHandle:
        """Open a terminal running ``command`` (a shell line; default a login shell) on a
        ``cols`` × ``rows`` terminal (default 80 × 24). Errors come as the usual typed ones
        (:class:`~cella.SandboxNotRunningError`, :class:`~cella.PermissionDeniedError`, ...)."""
        config = self._sandbox.connection
        host, port, tls, request, _key = _request(config, self._sandbox.id, _params(cols, rows, command, user, cwd))
        try:
            sock = socket.create_connection((host, port), timeout=timeout)
            if tls:
                sock = ssl.create_default_context().wrap_socket(sock, server_hostname=host)
            sock.sendall(request)
            buf = b""
            while True:
                head = _split_head(buf)
                if head is not None:
                    break
                data = sock.recv(65536)
                if not data:
                    raise CellaConnectionError("the server closed the connection before answering the terminal's upgrade")
                buf += data
        except OSError as exc:
            raise CellaConnectionError(f"could not open the terminal: {exc!r}") from exc
        status, hdrs, rest = head
        if status != 101:
            length = int(hdrs.get("content-length") or 0)
            try:
                while len(rest) < length:
                    data = sock.recv(65536)
                    if not data:
                        break
                    rest += data
            finally:
                sock.close()
            raise error_from_body(status, rest[:length] if length else rest, request_id=hdrs.get("x-request-id"))
        sock.settimeout(None)
        return PtyHandle(sock, rest)


class AsyncPtyHandle:
    """An open terminal on asyncio; see :class:`PtyHandle`."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, rest: bytes) -> None:
        self._reader, self._writer = reader, writer
        self._dec = _Decoder()
        self._pending: List[bytes] = []
        self._eof = False
        if rest:
            self._take(rest)

    @property
    def exit_code(self) -> Optional[int]:
        return self._dec.exit_code

    def _take(self, data: bytes) -> None:
        out, replies = self._dec.feed(data)
        self._pending += out
        for r in replies:
            self._writer.write(r)
        if self._dec.closed:
            self._eof = True

    async def send(self, data: Union[str, bytes]) -> None:
        self._writer.write(_input_frame(data))
        await self._writer.drain()

    async def resize(self, cols: int, rows: int) -> None:
        self._writer.write(_resize_frame(cols, rows))
        await self._writer.drain()

    async def read(self, timeout: Optional[float] = None) -> Optional[bytes]:
        while not self._pending:
            if self._eof:
                return b""
            try:
                data = await asyncio.wait_for(self._reader.read(65536), timeout)
            except asyncio.TimeoutError:
                return None
            except OSError as exc:
                raise CellaConnectionError(f"the terminal's connection broke: {exc!r}") from exc
            if not data:
                self._eof = True
            else:
                self._take(data)
        return self._pending.pop(0)

    def __aiter__(self) -> "AsyncPtyHandle":
        return self

    async def __anext__(self) -> bytes:
        chunk = await self.read()
        if not chunk:
            raise StopAsyncIteration
        return chunk

    async def read_all(self, timeout: Optional[float] = 60.0) -> bytes:
        out = bytearray()

        async def drain() -> None:
            async for chunk in self:
                out.extend(chunk)

        try:
            await asyncio.wait_for(drain(), timeout)
        except asyncio.TimeoutError:
            raise CellaTimeoutError(f"the terminal was still open after {timeout} s") from None
        return bytes(out)

    async def wait(self, timeout: Optional[float] = 60.0) -> Optional[int]:
        await self.read_all(timeout)
        return self.exit_code

    async def close(self) -> None:
        if self._writer.is_closing():
            return
        try:
            if not self._eof:
                self._writer.write(encode_frame(OP_CLOSE, struct.pack("!H", 1000)))
                await self._writer.drain()
        except OSError:
            pass
        self._eof = True
        self._writer.close()
        try:
            await self._writer.wait_closed()
        except OSError:
            pass

    async def __aenter__(self) -> "AsyncPtyHandle":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


class AsyncPty:
    """``sandbox.pty`` of an :class:`~cella.AsyncSandbox`; see :class:`Pty`."""

    def __init__(self, sandbox: "AsyncSandbox") -> None:
        self._sandbox = sandbox

    async def create(self, cols: Optional[int] = None, rows: Optional[int] = None, *, command: Optional[str] = None,
                     user: Optional[str] = None, cwd: Optional[str] = None, timeout: float = CONNECT_TIMEOUT) -> AsyncPtyHandle:
        config = self._sandbox.connection
        host, port, tls, request, _key = _request(config, self._sandbox.id, _params(cols, rows, command, user, cwd))
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(host, port, ssl=ssl.create_default_context() if tls else None,
                                        server_hostname=host if tls else None), timeout)
            writer.write(request)
            await writer.drain()
            buf = b""
            while True:
                head = _split_head(buf)
                if head is not None:
                    break
                data = await asyncio.wait_for(reader.read(65536), timeout)
                if not data:
                    raise CellaConnectionError("the server closed the connection before answering the terminal's upgrade")
                buf += data
        except (OSError, asyncio.TimeoutError) as exc:
            raise CellaConnectionError(f"could not open the terminal: {exc!r}") from exc
        status, hdrs, rest = head
        if status != 101:
            length = int(hdrs.get("content-length") or 0)
            try:
                while len(rest) < length:
                    data = await reader.read(65536)
                    if not data:
                        break
                    rest += data
            finally:
                writer.close()
            raise error_from_body(status, rest[:length] if length else rest, request_id=hdrs.get("x-request-id"))
        return AsyncPtyHandle(reader, writer, rest)
