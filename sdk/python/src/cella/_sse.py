"""A small server-sent events decoder (the subset the Cella server speaks)."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any, List, Optional, Union


@dataclass
class SSEEvent:
    event: str
    data: str

    def json(self) -> Any:
        return json.loads(self.data) if self.data else None


class KeepAlive:
    """A comment line (``:``): the server's sign of life while nothing happens."""


KEEPALIVE = KeepAlive()


class SSEDecoder:
    """Feed it lines (without their line ending); it answers an :class:`SSEEvent` when a
    blank line ends one, :data:`KEEPALIVE` for a comment, else None."""

    def __init__(self) -> None:
        self._event = ""
        self._data: List[str] = []

    def feed(self, line: str) -> Union[SSEEvent, KeepAlive, None]:
        line = line.rstrip("\r\n")
        if not line:
            if not self._data and not self._event:
                return None
            ev = SSEEvent(self._event or "message", "\n".join(self._data))
            self._event, self._data = "", []
            return ev
        if line.startswith(":"):
            return KEEPALIVE
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        return None

    def flush(self) -> Optional[SSEEvent]:
        """An event the stream ended in without its blank line."""
        if self._data or self._event:
            ev = SSEEvent(self._event or "message", "\n".join(self._data))
            self._event, self._data = "", []
            return ev
        return None


def output_bytes(payload: Any) -> bytes:
    """The bytes of a ``stdout``/``stderr`` event's data: a JSON string of UTF-8 text, or
    ``{"b64": ...}`` for bytes that are not."""
    if isinstance(payload, str):
        return payload.encode("utf-8")
    if isinstance(payload, dict) and "b64" in payload:
        return base64.b64decode(payload["b64"])
    return b""


class LineSplitter:
    """Splits a byte stream into text lines (``\\n`` or ``\\r\\n`` endings)."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, chunk: bytes) -> List[str]:
        self._buf += chunk
        if b"\n" not in chunk:
            return []
        *complete, rest = bytes(self._buf).split(b"\n")
        self._buf = bytearray(rest)
        return [line.rstrip(b"\r").decode("utf-8", "replace") for line in complete]

    def flush(self) -> List[str]:
        rest, self._buf = bytes(self._buf), bytearray()
        return [rest.rstrip(b"\r").decode("utf-8", "replace")] if rest else []
