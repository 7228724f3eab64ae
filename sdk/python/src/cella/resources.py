"""Workspace resources that live apart from one sandbox, with blocking calls: snapshots
(:class:`Snapshot`), artifacts (:class:`Artifact`) and custom templates (:class:`Template`)."""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Union

import httpx

from ._common import next_log_offset, seg
from ._config import ConnectionConfig
from ._transport import SyncTransport, _wrap_transport_error
from .errors import CellaTimeoutError, TemplateBuildError
from .models import ArtifactInfo, SnapshotInfo, TemplateBuild, TemplateInfo

__all__ = ["Snapshot", "Artifact", "Template", "TemplateBuildHandle"]

LogCallback = Optional[Callable[[str], Any]]
ArtifactRef = Union[str, ArtifactInfo]


def connect(server: Optional[str] = None, api_key: Optional[str] = None, max_retries: Optional[int] = None,
            request_timeout: Optional[float] = None, headers: Optional[Dict[str, str]] = None) -> SyncTransport:
    """A transport for one call (``server`` and ``api_key`` default to ``CELLA_SERVER`` and
    ``CELLA_API_KEY``)."""
    return SyncTransport(ConnectionConfig.resolve(server=server, api_key=api_key, max_retries=max_retries,
                                                  request_timeout=request_timeout, headers=headers))


def list_pages(transport: SyncTransport, path: str, params: Dict[str, Any], limit: Optional[int]) -> List[Dict[str, Any]]:
    """Follow a paginated list to its end, or until ``limit`` items."""
    found: List[Dict[str, Any]] = []
    cursor: Optional[str] = None
    while True:
        page_params = dict(params, limit=min(1000, limit - len(found)) if limit is not None else None, cursor=cursor)
        page = transport.request("GET", path, params=page_params).json()
        found.extend(page.get("data") or [])
        cursor = page.get("next_cursor")
        if not cursor or (limit is not None and len(found) >= limit):
            return found[:limit] if limit is not None else found


def artifact_id(ref: ArtifactRef) -> str:
    return ref.id if isinstance(ref, ArtifactInfo) else str(ref)


class Snapshot:
    """The workspace's snapshots. Take one with :meth:`cella.Sandbox.create_snapshot`, start
    a sandbox from one with ``Sandbox.create(snapshot_id=...)``.

    Every method takes the connection keywords of :meth:`cella.Sandbox.create` (``server``,
    ``api_key``, ``max_retries``, ``request_timeout``, ``headers``)."""

    @staticmethod
    def list(*, limit: Optional[int] = None, **connection: Any) -> List[SnapshotInfo]:
        """The snapshots, newest first (every page, or the first ``limit``)."""
        t = connect(**connection)
        try:
            return [SnapshotInfo.from_dict(d) for d in list_pages(t, "/snapshots", {}, limit)]
        finally:
            t.close()

    @staticmethod
    def get(snapshot_id: str, **connection: Any) -> SnapshotInfo:
        t = connect(**connection)
        try:
            return SnapshotInfo.from_dict(t.data("GET", "/snapshots/" + seg(snapshot_id)))
        finally:
            t.close()

    @staticmethod
    def delete(snapshot_id: str, **connection: Any) -> SnapshotInfo:
        """Delete a snapshot (sandboxes made from it keep their files); answers it as it was."""
        t = connect(**connection)
        try:
            return SnapshotInfo.from_dict(t.data("DELETE", "/snapshots/" + seg(snapshot_id)))
        finally:
            t.close()


class Artifact:
    """Files kept from sandboxes (by :meth:`cella.Sandbox.run` or
    :meth:`cella.Sandbox.collect_artifacts`) until they expire. Each method takes an id or an
    :class:`~cella.ArtifactInfo`, and the connection keywords of :meth:`cella.Sandbox.create`."""

    @staticmethod
    def list(sandbox_id: Optional[str] = None, *, limit: Optional[int] = None, **connection: Any) -> List[ArtifactInfo]:
        """The workspace's artifacts, newest first; ``sandbox_id`` keeps one sandbox's."""
        t = connect(**connection)
        try:
            return [ArtifactInfo.from_dict(d) for d in list_pages(t, "/artifacts", {"sandbox_id": sandbox_id}, limit)]
        finally:
            t.close()

    @staticmethod
    def download(artifact: ArtifactRef, **connection: Any) -> bytes:
        """The artifact's bytes."""
        t = connect(**connection)
        try:
            return t.request("GET", "/artifacts/" + seg(artifact_id(artifact))).content
        finally:
            t.close()

    read = download

    @staticmethod
    def download_stream(artifact: ArtifactRef, **connection: Any) -> Iterator[bytes]:
        """The artifact's bytes as they come, in chunks."""
        t = connect(**connection)
        try:
            with t.stream("GET", "/artifacts/" + seg(artifact_id(artifact))) as resp:
                try:
                    for chunk in resp.iter_bytes():
                        yield chunk
                except httpx.TransportError as exc:
                    raise _wrap_transport_error(exc) from exc
        finally:
            t.close()

    @staticmethod
    def delete(artifact: ArtifactRef, **connection: Any) -> ArtifactInfo:
        t = connect(**connection)
        try:
            return ArtifactInfo.from_dict(t.data("DELETE", "/artifacts/" + seg(artifact_id(artifact))))
        finally:
            t.close()


class Template:
    """Custom templates: build one from a spec (see the API reference), read it, delete it.
    Each method takes the connection keywords of :meth:`cella.Sandbox.create`."""

    @staticmethod
    def build(spec: Mapping[str, Any], **connection: Any) -> "TemplateBuildHandle":
        """Start a build (``POST /api/v1/templates``) and answer its handle at once; call
        :meth:`TemplateBuildHandle.wait` for its end. Posting the spec of an existing template
        of the workspace rebuilds it."""
        t = connect(**connection)
        try:
            return TemplateBuildHandle(TemplateBuild.from_dict(t.data("POST", "/templates", json=dict(spec))), t)
        except BaseException:
            t.close()
            raise

    @staticmethod
    def get(template_id: str, **connection: Any) -> TemplateInfo:
        t = connect(**connection)
        try:
            return TemplateInfo.from_dict(t.data("GET", "/templates/" + seg(template_id)))
        finally:
            t.close()

    @staticmethod
    def list(**connection: Any) -> List[TemplateInfo]:
        """The catalog: the built-in templates and the workspace's own, with their sizes."""
        t = connect(**connection)
        try:
            return [TemplateInfo.from_dict(d) for d in t.data("GET", "/templates") or []]
        finally:
            t.close()

    @staticmethod
    def builds(template_id: str, *, limit: Optional[int] = None, **connection: Any) -> List[TemplateBuild]:
        """A template's builds, newest first."""
        t = connect(**connection)
        try:
            return [TemplateBuild.from_dict(d) for d in list_pages(t, f"/templates/{seg(template_id)}/builds", {}, limit)]
        finally:
            t.close()

    @staticmethod
    def get_build(template_id: str, build_id: str, **connection: Any) -> TemplateBuild:
        t = connect(**connection)
        try:
            return TemplateBuild.from_dict(t.data("GET", f"/templates/{seg(template_id)}/builds/{seg(build_id)}"))
        finally:
            t.close()

    @staticmethod
    def delete(template_id: str, **connection: Any) -> TemplateInfo:
        """Delete one of the workspace's templates (refused with a ConflictError while
        sandboxes or snapshots use it); answers its catalog entry as it was."""
        t = connect(**connection)
        try:
            return TemplateInfo.from_dict(t.data("DELETE", "/templates/" + seg(template_id)))
        finally:
            t.close()


class TemplateBuildHandle:
    """A template build in progress: :meth:`wait` for its end."""

    def __init__(self, build: TemplateBuild, transport: SyncTransport) -> None:
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
        """The whole log read so far."""
        return "".join(self._log)

    def _path(self) -> str:
        return f"/templates/{seg(self.template_id)}/builds/{seg(self.id)}"

    def refresh(self, on_log: LogCallback = None) -> TemplateBuild:
        """Read the build again, with the log written since the last read (passed to
        ``on_log``, and added to :attr:`log`)."""
        data = self._transport.data("GET", self._path(), params={"log_offset": self._offset})
        self.info = TemplateBuild.from_dict(data)
        if self.info.log:
            self._log.append(self.info.log)
            if on_log is not None:
                on_log(self.info.log)
        self._offset = next_log_offset(data)
        return self.info

    def wait(self, on_log: LogCallback = None, *, timeout: Optional[float] = 1800.0, interval: float = 0.25,
             check: bool = False) -> TemplateBuild:
        """Poll until the build is ``ready`` or ``failed`` and answer it, its ``log`` the
        whole log. ``on_log`` gets each new piece of the log as it comes. ``check=True``
        raises :class:`~cella.TemplateBuildError` for a failed build;
        :class:`~cella.CellaTimeoutError` after ``timeout`` seconds."""
        if self.log and on_log is not None:
            on_log(self.log)
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.info.finished:
            if deadline is not None and time.monotonic() >= deadline:
                raise CellaTimeoutError(f"build {self.id} of {self.template_id} was not finished after {timeout} s")
            time.sleep(interval)
            self.refresh(on_log)
        self.info.log, self.info.log_offset = self.log, 0
        if check and not self.info.ok:
            raise TemplateBuildError(self.info)
        return self.info

    def close(self) -> None:
        self._transport.close()

    def __enter__(self) -> "TemplateBuildHandle":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"TemplateBuildHandle(id={self.id!r}, template_id={self.template_id!r}, state={self.state!r})"
