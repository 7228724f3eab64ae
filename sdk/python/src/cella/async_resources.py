"""Snapshots, artifacts and custom templates on asyncio: the same surface as
:mod:`cella.resources` with coroutines."""

from __future__ import annotations

import asyncio
import inspect
import time
from typing import Any, AsyncIterator, Callable, Dict, List, Mapping, Optional

import httpx

from ._common import next_log_offset, seg
from ._config import ConnectionConfig
from ._transport import AsyncTransport, _wrap_transport_error
from .errors import CellaTimeoutError, TemplateBuildError
from .models import ArtifactInfo, SnapshotInfo, TemplateBuild, TemplateInfo
from .resources import ArtifactRef, artifact_id

__all__ = ["AsyncSnapshot", "AsyncArtifact", "AsyncTemplate", "AsyncTemplateBuildHandle"]

LogCallback = Optional[Callable[[str], Any]]


def connect(server: Optional[str] = None, api_key: Optional[str] = None, max_retries: Optional[int] = None,
            request_timeout: Optional[float] = None, headers: Optional[Dict[str, str]] = None) -> AsyncTransport:
    return AsyncTransport(ConnectionConfig.resolve(server=server, api_key=api_key, max_retries=max_retries,
                                                   request_timeout=request_timeout, headers=headers))


async def list_pages(transport: AsyncTransport, path: str, params: Dict[str, Any], limit: Optional[int]) -> List[Dict[str, Any]]:
    found: List[Dict[str, Any]] = []
    cursor: Optional[str] = None
    while True:
        page_params = dict(params, limit=min(1000, limit - len(found)) if limit is not None else None, cursor=cursor)
        page = (await transport.request("GET", path, params=page_params)).json()
        found.extend(page.get("data") or [])
        cursor = page.get("next_cursor")
        if not cursor or (limit is not None and len(found) >= limit):
            return found[:limit] if limit is not None else found


class AsyncSnapshot:
    """The workspace's snapshots; see :class:`cella.Snapshot`."""

    @staticmethod
    async def list(*, limit: Optional[int] = None, **connection: Any) -> List[SnapshotInfo]:
        t = connect(**connection)
        try:
            return [SnapshotInfo.from_dict(d) for d in await list_pages(t, "/snapshots", {}, limit)]
        finally:
            await t.aclose()

    @staticmethod
    async def get(snapshot_id: str, **connection: Any) -> SnapshotInfo:
        t = connect(**connection)
        try:
            return SnapshotInfo.from_dict(await t.data("GET", "/snapshots/" + seg(snapshot_id)))
        finally:
            await t.aclose()

    @staticmethod
    async def delete(snapshot_id: str, **connection: Any) -> SnapshotInfo:
        t = connect(**connection)
        try:
            return SnapshotInfo.from_dict(await t.data("DELETE", "/snapshots/" + seg(snapshot_id)))
        finally:
            await t.aclose()


class AsyncArtifact:
    """Files kept from sandboxes; see :class:`cella.Artifact`."""

    @staticmethod
    async def list(sandbox_id: Optional[str] = None, *, limit: Optional[int] = None, **connection: Any) -> List[ArtifactInfo]:
        t = connect(**connection)
        try:
            return [ArtifactInfo.from_dict(d) for d in await list_pages(t, "/artifacts", {"sandbox_id": sandbox_id}, limit)]
        finally:
            await t.aclose()

    @staticmethod
    async def download(artifact: ArtifactRef, **connection: Any) -> bytes:
        t = connect(**connection)
        try:
            return (await t.request("GET", "/artifacts/" + seg(artifact_id(artifact)))).content
        finally:
            await t.aclose()

    read = download

    @staticmethod
    async def download_stream(artifact: ArtifactRef, **connection: Any) -> AsyncIterator[bytes]:
        t = connect(**connection)
        try:
            async with t.stream("GET", "/artifacts/" + seg(artifact_id(artifact))) as resp:
                try:
                    async for chunk in resp.aiter_bytes():
                        yield chunk
                except httpx.TransportError as exc:
                    raise _wrap_transport_error(exc) from exc
        finally:
            await t.aclose()

    @staticmethod
    async def delete(artifact: ArtifactRef, **connection: Any) -> ArtifactInfo:
        t = connect(**connection)
        try:
            return ArtifactInfo.from_dict(await t.data("DELETE", "/artifacts/" + seg(artifact_id(artifact))))
        finally:
            await t.aclose()


class AsyncTemplate:
    """Custom templates; see :class:`cella.Template`."""

    @staticmethod
    async def build(spec: Mapping[str, Any], **connection: Any) -> "AsyncTemplateBuildHandle":
        t = connect(**connection)
        try:
            return AsyncTemplateBuildHandle(TemplateBuild.from_dict(await t.data("POST", "/templates", json=dict(spec))), t)
        except BaseException:
            await t.aclose()
            raise

    @staticmethod
    async def get(template_id: str, **connection: Any) -> TemplateInfo:
        t = connect(**connection)
        try:
            return TemplateInfo.from_dict(await t.data("GET", "/templates/" + seg(template_id)))
        finally:
            await t.aclose()

    @staticmethod
    async def list(**connection: Any) -> List[TemplateInfo]:
        t = connect(**connection)
        try:
            return [TemplateInfo.from_dict(d) for d in await t.data("GET", "/templates") or []]
        finally:
            await t.aclose()

    @staticmethod
    async def builds(template_id: str, *, limit: Optional[int] = None, **connection: Any) -> List[TemplateBuild]:
        t = connect(**connection)
        try:
            return [TemplateBuild.from_dict(d) for d in await list_pages(t, f"/templates/{seg(template_id)}/builds", {}, limit)]
        finally:
            await t.aclose()

    @staticmethod
    async def get_build(template_id: str, build_id: str, **connection: Any) -> TemplateBuild:
        t = connect(**connection)
        try:
            return TemplateBuild.from_dict(await t.data("GET", f"/templates/{seg(template_id)}/builds/{seg(build_id)}"))
        finally:
            await t.aclose()

    @staticmethod
    async def delete(template_id: str, **connection: Any) -> TemplateInfo:
        t = connect(**connection)
        try:
            return TemplateInfo.from_dict(await t.data("DELETE", "/templates/" + seg(template_id)))
        finally:
            await t.aclose()


class AsyncTemplateBuildHandle:
    """A template build in progress; see :class:`cella.TemplateBuildHandle`. ``on_log`` may
    be a coroutine function."""

    def __init__(self, build: TemplateBuild, transport: AsyncTransport) -> None:
        self.info = build
        self._transport = transport
        self._log: List[str] = [build.log] if build.log_offset == 0 else []
        self._offset = next_log_offset(build.raw) if build.log_offset == 0 else 0

    @property
    def id(self) -> str:
        return self.info.id

    @property
    def template_id(self) -> str:
        return self.info.template_id

    @property
    def state(self) -> str:
        return self.info.state

    @property
    def log(self) -> str:
        return "".join(self._log)

    async def refresh(self, on_log: LogCallback = None) -> TemplateBuild:
        path = f"/templates/{seg(self.template_id)}/builds/{seg(self.id)}"
        data = await self._transport.data("GET", path, params={"log_offset": self._offset})
        self.info = TemplateBuild.from_dict(data)
        if self.info.log:
            self._log.append(self.info.log)
            await _call(on_log, self.info.log)
        self._offset = next_log_offset(data)
        return self.info

    async def wait(self, on_log: LogCallback = None, *, timeout: Optional[float] = 1800.0, interval: float = 0.25,
                   check: bool = False) -> TemplateBuild:
        if self.log:
            await _call(on_log, self.log)
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.info.finished:
            if deadline is not None and time.monotonic() >= deadline:
                raise CellaTimeoutError(f"build {self.id} of {self.template_id} was not finished after {timeout} s")
            await asyncio.sleep(interval)
            await self.refresh(on_log)
        self.info.log, self.info.log_offset = self.log, 0
        if check and not self.info.ok:
            raise TemplateBuildError(self.info)
        return self.info

    async def aclose(self) -> None:
        await self._transport.aclose()

    async def __aenter__(self) -> "AsyncTemplateBuildHandle":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()


async def _call(callback: LogCallback, text: str) -> None:
    if callback is None:
        return
    out = callback(text)
    if inspect.isawaitable(out):
        await out
