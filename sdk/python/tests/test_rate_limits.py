"""429 answers: retried after Retry-After up to max_retries, then RateLimitedError.

These run against a second server of their own whose limits are tiny."""

from __future__ import annotations

import asyncio
import io
import time
from typing import Iterator

import pytest

from conftest import SIZE, Server, start_server, stop_server

from cella import AsyncSandbox, RateLimitedError, Sandbox

LIMITS = """
[rate_limits]
read = { per_second = 0.5, burst = 2 }
exec = { per_second = 1.0, burst = 1 }
"""


@pytest.fixture(scope="module")
def limited() -> Iterator[Server]:
    srv = start_server(LIMITS, name="cella-limited")
    try:
        yield srv
    finally:
        left = stop_server(srv)
        assert not left, f"the tests left sandboxes behind: {left}"


def _drain(srv: Server) -> RateLimitedError:
    """Use up the read bucket; answers the 429 that says so."""
    for _ in range(20):
        try:
            Sandbox.list(server=srv.url, api_key=srv.api_key, max_retries=0, limit=1)
        except RateLimitedError as exc:
            return exc
    raise AssertionError("the read limit never answered 429")


def test_rate_limited_error_without_retries(limited: Server) -> None:
    err = _drain(limited)
    assert err.status == 429 and err.code == "RATE_LIMITED"
    assert err.retry_after is not None and err.retry_after >= 1
    assert err.details["group"] == "read" and err.details["limit"] == 2
    assert err.request_id


def test_retried_after_retry_after(limited: Server) -> None:
    _drain(limited)
    t0 = time.monotonic()
    for _ in range(4):  # each would be a 429 without the retries
        Sandbox.list(server=limited.url, api_key=limited.api_key, limit=1)
    assert time.monotonic() - t0 >= 0.9  # it waited for the bucket at least once


def test_retries_are_bounded(limited: Server, monkeypatch) -> None:
    import cella._transport as transport

    waits = []
    monkeypatch.setattr(transport.time, "sleep", waits.append)  # retry at once: still limited
    _drain(limited)
    with pytest.raises(RateLimitedError):
        Sandbox.list(server=limited.url, api_key=limited.api_key, limit=1)
    assert len(waits) == 3 and all(w >= 1 for w in waits)  # the default: 3 retries, Retry-After
    waits.clear()
    with pytest.raises(RateLimitedError):
        Sandbox.list(server=limited.url, api_key=limited.api_key, limit=1, max_retries=5)
    assert len(waits) == 5


def test_uploads_are_sent_again(limited: Server) -> None:
    with Sandbox.create(size=SIZE, server=limited.url, api_key=limited.api_key) as sb:
        sb.files.write("/home/user/a", b"first")
        # the exec bucket is empty now: these are answered 429 first, then sent again whole
        sb.files.write("/home/user/b", b"second")
        sb.files.write("/home/user/c", io.BytesIO(b"third, from a file object"))
        assert sb.commands.run("cat /home/user/a /home/user/b /home/user/c").stdout == "firstsecondthird, from a file object"


def test_async_rate_limits(limited: Server) -> None:
    async def main() -> None:
        err = None
        for _ in range(20):
            try:
                await AsyncSandbox.list(server=limited.url, api_key=limited.api_key, max_retries=0, limit=1)
            except RateLimitedError as exc:
                err = exc
                break
        assert err is not None and err.retry_after >= 1
        for _ in range(3):
            await AsyncSandbox.list(server=limited.url, api_key=limited.api_key, limit=1)
        async with AsyncSandbox.create(size=SIZE, server=limited.url, api_key=limited.api_key) as sb:
            await sb.files.write("/home/user/a", "1")
            await sb.files.write("/home/user/b", io.BytesIO(b"2"))
            assert (await sb.commands.run("cat /home/user/a /home/user/b")).stdout == "12"

    asyncio.run(main())
