"""HTTP plumbing shared by every call: the bearer key, error envelopes turned into typed
exceptions, and 429 answers retried after ``Retry-After``."""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import time
from typing import Any, AsyncIterator, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import httpx

from ._version import __version__
from ._config import ConnectionConfig
from .errors import (
    CellaConnectionError,
    CellaError,
    CellaTimeoutError,
    error_from_body,
    parse_retry_after,
)


class _Default:
    def __repr__(self) -> str:  # pragma: no cover
        return "DEFAULT"


DEFAULT: Any = _Default()
"""A request's timeout when none is given: the connection's ``request_timeout``."""

CONNECT_TIMEOUT = 10.0
UPLOAD_CHUNK = 256 * 1024

# A kept-alive connection the server closed after its previous answer (as it does when it
# answered before reading a request's body: 401, 403, 404, 429, ...) fails the next request
# sent on it at once, before the server saw anything. Such a request is sent once more on a
# new connection: always for idempotent methods, and for the others only when it failed
# within STALE_CONNECTION_WINDOW seconds (a request that ran longer may have had effects).
STALE_CONNECTION_ERRORS = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)
STALE_CONNECTION_WINDOW = 1.0
IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})


def _resend_after(exc: Exception, method: str, started: float, body: "_Body", resent: bool) -> bool:
    if resent or not body.replayable or not isinstance(exc, STALE_CONNECTION_ERRORS):
        return False
    return method.upper() in IDEMPOTENT or time.monotonic() - started < STALE_CONNECTION_WINDOW

Params = Union[Mapping[str, Any], Sequence[Tuple[str, Any]], None]


def _timeout(seconds: Optional[float]) -> httpx.Timeout:
    return httpx.Timeout(seconds, connect=CONNECT_TIMEOUT if seconds is None else min(CONNECT_TIMEOUT, seconds))


def _params(params: Params) -> Any:
    if params is None:
        return None
    items = params.items() if isinstance(params, Mapping) else params
    out: List[Tuple[str, str]] = []
    for key, value in items:
        if value is None:
            continue
        if isinstance(value, bool):
            value = "true" if value else "false"
        out.append((key, str(value)))
    return out


def _headers(config: ConnectionConfig) -> Dict[str, str]:
    headers = {"User-Agent": f"cella-python/{__version__}", "Accept": "application/json"}
    if config.api_key:
        headers["Authorization"] = f"Bearer {config.api_key}"
    headers.update(config.headers)
    return headers


def _error(resp: httpx.Response, body: bytes) -> CellaError:
    return error_from_body(
        resp.status_code,
        body,
        request_id=resp.headers.get("x-request-id"),
        retry_after=parse_retry_after(resp.headers.get("retry-after")),
    )


def _wrap_transport_error(exc: Exception) -> CellaError:
    if isinstance(exc, httpx.TimeoutException):
        err: CellaError = CellaTimeoutError(f"timed out talking to the Cella server: {exc!r}")
    else:
        err = CellaConnectionError(f"could not talk to the Cella server: {exc!r}")
    return err


class _Body:
    """A request body that can be sent again after a 429 (bytes, text, or a seekable file)."""

    def __init__(self, content: Any) -> None:
        self.content = content
        self.start: Optional[int] = None
        self.length: Optional[int] = None
        if isinstance(content, (io.IOBase,)) or (hasattr(content, "read") and not isinstance(content, (bytes, str))):
            try:
                self.start = content.tell()
                end = content.seek(0, os.SEEK_END)
                content.seek(self.start)
                self.length = end - self.start
            except (OSError, AttributeError, ValueError):
                self.start = None

    @property
    def is_file(self) -> bool:
        return hasattr(self.content, "read") and not isinstance(self.content, (bytes, str))

    @property
    def replayable(self) -> bool:
        if self.content is None or isinstance(self.content, (bytes, bytearray, str)):
            return True
        return self.is_file and self.start is not None

    def headers(self) -> Dict[str, str]:
        if self.is_file and self.length is not None:
            return {"Content-Length": str(self.length)}
        return {}

    def rewind(self) -> None:
        if self.is_file and self.start is not None:
            self.content.seek(self.start)

    def sync_content(self) -> Any:
        if self.is_file:
            f = self.content

            def chunks() -> Iterator[bytes]:
                while True:
                    chunk = f.read(UPLOAD_CHUNK)
                    if not chunk:
                        return
                    yield chunk.encode("utf-8") if isinstance(chunk, str) else chunk

            return chunks()
        if isinstance(self.content, bytearray):
            return bytes(self.content)
        return self.content

    def async_content(self) -> Any:
        if self.is_file:
            f = self.content

            async def chunks() -> AsyncIterator[bytes]:
                while True:
                    chunk = f.read(UPLOAD_CHUNK)
                    if not chunk:
                        return
                    yield chunk.encode("utf-8") if isinstance(chunk, str) else chunk

            return chunks()
        if isinstance(self.content, bytearray):
            return bytes(self.content)
        return self.content


class SyncTransport:
    """Blocking calls over one ``httpx.Client``."""

    def __init__(self, config: ConnectionConfig, http_client: Optional[httpx.Client] = None) -> None:
        self.config = config
        self._owns_client = http_client is None
        self.client = http_client or httpx.Client(
            base_url=config.api_url, headers=_headers(config), timeout=_timeout(config.request_timeout)
        )

    def _build(self, method: str, path: str, params: Params, json: Any, body: _Body, headers: Optional[Dict[str, str]], timeout: Any) -> httpx.Request:
        hdrs = dict(headers or {})
        hdrs.update(body.headers())
        return self.client.build_request(
            method,
            path,
            params=_params(params),
            json=json,
            content=body.sync_content() if body.content is not None else None,
            headers=hdrs or None,
            timeout=_timeout(self.config.request_timeout if timeout is DEFAULT else timeout),
        )

    def _send(self, method: str, path: str, *, params: Params, json: Any, content: Any, headers: Optional[Dict[str, str]], timeout: Any, stream: bool) -> httpx.Response:
        body = _Body(content)
        attempt = 0
        resent = False
        while True:
            body.rewind()
            request = self._build(method, path, params, json, body, headers, timeout)
            started = time.monotonic()
            try:
                resp = self.client.send(request, stream=stream)
            except httpx.TransportError as exc:
                if _resend_after(exc, method, started, body, resent):
                    resent = True
                    continue
                raise _wrap_transport_error(exc) from exc
            if resp.status_code < 400:
                return resp
            try:
                data = resp.read()
            except httpx.TransportError:
                data = b""
            finally:
                resp.close()
            err = _error(resp, data)
            if resp.status_code == 429 and attempt < self.config.max_retries and body.replayable:
                attempt += 1
                time.sleep(min(err.retry_after if err.retry_after is not None else 1.0, self.config.max_retry_wait))
                continue
            raise err

    def request(self, method: str, path: str, *, params: Params = None, json: Any = None, content: Any = None, headers: Optional[Dict[str, str]] = None, timeout: Any = DEFAULT) -> httpx.Response:
        return self._send(method, path, params=params, json=json, content=content, headers=headers, timeout=timeout, stream=False)

    def data(self, method: str, path: str, **kwargs: Any) -> Any:
        """The ``data`` of a JSON answer."""
        return self.request(method, path, **kwargs).json().get("data")

    @contextlib.contextmanager
    def stream(self, method: str, path: str, *, params: Params = None, json: Any = None, content: Any = None, headers: Optional[Dict[str, str]] = None, timeout: Any = DEFAULT) -> Iterator[httpx.Response]:
        """An answer whose body is read as it comes (events, downloads); errors found
        before the body starts are raised here."""
        resp = self._send(method, path, params=params, json=json, content=content, headers=headers, timeout=timeout, stream=True)
        try:
            yield resp
        finally:
            resp.close()

    def close(self) -> None:
        if self._owns_client:
            self.client.close()


class AsyncTransport:
    """Calls on asyncio over one ``httpx.AsyncClient``."""

    def __init__(self, config: ConnectionConfig, http_client: Optional[httpx.AsyncClient] = None) -> None:
        self.config = config
        self._owns_client = http_client is None
        self.client = http_client or httpx.AsyncClient(
            base_url=config.api_url, headers=_headers(config), timeout=_timeout(config.request_timeout)
        )

    def _build(self, method: str, path: str, params: Params, json: Any, body: _Body, headers: Optional[Dict[str, str]], timeout: Any) -> httpx.Request:
        hdrs = dict(headers or {})
        hdrs.update(body.headers())
        return self.client.build_request(
            method,
            path,
            params=_params(params),
            json=json,
            content=body.async_content() if body.content is not None else None,
            headers=hdrs or None,
            timeout=_timeout(self.config.request_timeout if timeout is DEFAULT else timeout),
        )

    async def _send(self, method: str, path: str, *, params: Params, json: Any, content: Any, headers: Optional[Dict[str, str]], timeout: Any, stream: bool) -> httpx.Response:
        body = _Body(content)
        attempt = 0
        resent = False
        while True:
            body.rewind()
            request = self._build(method, path, params, json, body, headers, timeout)
            started = time.monotonic()
            try:
                resp = await self.client.send(request, stream=stream)
            except httpx.TransportError as exc:
                if _resend_after(exc, method, started, body, resent):
                    resent = True
                    continue
                raise _wrap_transport_error(exc) from exc
            if resp.status_code < 400:
                return resp
            try:
                data = await resp.aread()
            except httpx.TransportError:
                data = b""
            finally:
                await resp.aclose()
            err = _error(resp, data)
            if resp.status_code == 429 and attempt < self.config.max_retries and body.replayable:
                attempt += 1
                await asyncio.sleep(min(err.retry_after if err.retry_after is not None else 1.0, self.config.max_retry_wait))
                continue
            raise err

    async def request(self, method: str, path: str, *, params: Params = None, json: Any = None, content: Any = None, headers: Optional[Dict[str, str]] = None, timeout: Any = DEFAULT) -> httpx.Response:
        return await self._send(method, path, params=params, json=json, content=content, headers=headers, timeout=timeout, stream=False)

    async def data(self, method: str, path: str, **kwargs: Any) -> Any:
        return (await self.request(method, path, **kwargs)).json().get("data")

    @contextlib.asynccontextmanager
    async def stream(self, method: str, path: str, *, params: Params = None, json: Any = None, content: Any = None, headers: Optional[Dict[str, str]] = None, timeout: Any = DEFAULT) -> AsyncIterator[httpx.Response]:
        resp = await self._send(method, path, params=params, json=json, content=content, headers=headers, timeout=timeout, stream=True)
        try:
            yield resp
        finally:
            await resp.aclose()

    async def aclose(self) -> None:
        if self._owns_client:
            await self.client.aclose()
