"""The asyncio client: :class:`AsyncSandbox`, the same surface as :class:`~cella.Sandbox`
with coroutines."""

from __future__ import annotations

import asyncio
import inspect
import time
from typing import Any, AsyncGenerator, AsyncIterator, BinaryIO, Dict, Generator, List, Mapping, Optional, Sequence, Union

import httpx

from ._common import (
    Callback,
    Command,
    OutputCollector,
    code_body,
    code_http_timeout,
    command_body,
    RunFiles,
    create_body,
    run_body,
    run_http_timeout,
    exec_http_timeout,
    file_mode,
    sandbox_path,
    seg,
    snapshot_body,
    signal_value,
    stream_error,
    whole_seconds,
)
from ._config import ConnectionConfig
from .pty import AsyncPty
from ._sse import KEEPALIVE, KeepAlive, LineSplitter, SSEDecoder, SSEEvent
from ._transport import AsyncTransport, _wrap_transport_error
from .errors import CellaError, CellaTimeoutError, CommandExitError, ConflictError, NotFoundError, UnavailableError
from .models import (
    CodeContext,
    CommandResult,
    EntryInfo,
    EntryList,
    Execution,
    ExposedPort,
    FilesystemEvent,
    KernelInfo,
    NetworkArg,
    OutputChunk,
    ProcessInfo,
    ArtifactInfo,
    RunResult,
    SandboxInfo,
    SandboxUsage,
    SnapshotInfo,
)
from .sandbox import _host_of, _list_params, _write_entries

__all__ = ["AsyncSandbox", "AsyncCommands", "AsyncCommandHandle", "AsyncFiles", "AsyncWatchHandle", "AsyncCodeInterpreter"]


async def _sse_events(resp: httpx.Response) -> AsyncGenerator[Union[SSEEvent, KeepAlive], None]:
    lines = LineSplitter()
    decoder = SSEDecoder()
    try:
        async for chunk in resp.aiter_bytes():
            for line in lines.feed(chunk):
                ev = decoder.feed(line)
                if ev is not None:
                    yield ev
    except httpx.TransportError as exc:
        raise _wrap_transport_error(exc) from exc
    for line in lines.flush():
        ev = decoder.feed(line)
        if ev is not None:
            yield ev
    last = decoder.flush()
    if last is not None:
        yield last


async def _call(callback: Callback, text: str) -> None:
    if callback is None:
        return
    out = callback(text)
    if inspect.isawaitable(out):
        await out


class AsyncSandboxPages:
    """A listing of sandboxes on asyncio: ``async for`` reads a page at a time as it goes;
    ``await`` reads it whole into a list."""

    def __init__(self, config: ConnectionConfig, state: Optional[str], metadata: Optional[Mapping[str, str]], limit: Optional[int], page_size: Optional[int]) -> None:
        self._config, self._state, self._metadata = config, state, dict(metadata or {})
        self._limit, self._page_size = limit, page_size

    async def __aiter__(self) -> AsyncIterator[SandboxInfo]:
        transport = AsyncTransport(self._config)
        try:
            found, cursor = 0, None
            while True:
                params = _list_params(self._state, self._metadata, self._limit, found, cursor, self._page_size)
                page = (await transport.request("GET", "/sandboxes", params=params)).json()
                for d in page.get("data") or []:
                    if self._limit is not None and found >= self._limit:
                        return
                    found += 1
                    yield SandboxInfo.from_dict(d)
                cursor = page.get("next_cursor")
                if not cursor or (self._limit is not None and found >= self._limit):
                    return
        finally:
            await transport.aclose()

    async def all(self) -> List[SandboxInfo]:
        return [s async for s in self]

    def __await__(self) -> Generator[Any, None, List[SandboxInfo]]:
        return self.all().__await__()


def _connection(server: Optional[str], api_key: Optional[str], max_retries: Optional[int], request_timeout: Optional[float], headers: Optional[Dict[str, str]]) -> ConnectionConfig:
    return ConnectionConfig.resolve(server=server, api_key=api_key, max_retries=max_retries, request_timeout=request_timeout, headers=headers)


class _Creating:
    """What :meth:`AsyncSandbox.create` answers: await it for the sandbox, or use it in
    ``async with`` to have the sandbox destroyed at the end of the block."""

    def __init__(self, make: Any) -> None:
        self._make = make
        self._sandbox: Optional["AsyncSandbox"] = None

    def __await__(self) -> Generator[Any, None, "AsyncSandbox"]:
        return self._make().__await__()

    async def __aenter__(self) -> "AsyncSandbox":
        self._sandbox = await self._make()
        return self._sandbox

    async def __aexit__(self, *exc: Any) -> None:
        if self._sandbox is not None:
            await self._sandbox.__aexit__(*exc)


class AsyncSandbox:
    """A sandbox on a Cella server, driven on asyncio::

        async with AsyncSandbox.create() as sb:
            result = await sb.commands.run("echo hi")
    """

    def __init__(self, info: SandboxInfo, transport: AsyncTransport) -> None:
        self._info = info
        self._transport = transport
        self.commands = AsyncCommands(self)
        self.files = AsyncFiles(self)
        self.code = AsyncCodeInterpreter(self)
        self.pty = AsyncPty(self)

    # ------------------------------------------------------------------ making and finding

    @classmethod
    def create(
        cls,
        template: Optional[str] = None,
        size: Optional[str] = None,
        timeout: Optional[float] = None,
        metadata: Optional[Mapping[str, str]] = None,
        env: Optional[Mapping[str, str]] = None,
        network: NetworkArg = None,
        *,
        idle_timeout: Optional[float] = None,
        persistent: Optional[bool] = None,
        always_on: Optional[bool] = None,
        wait: bool = True,
        snapshot_id: Optional[str] = None,
        runtime: Optional[str] = None,
        extra: Optional[Mapping[str, Any]] = None,
        server: Optional[str] = None,
        api_key: Optional[str] = None,
        max_retries: Optional[int] = None,
        request_timeout: Optional[float] = None,
        headers: Optional[Dict[str, str]] = None,
    ) -> _Creating:
        """Create a sandbox; see :meth:`cella.Sandbox.create`. ``await`` the answer, or use
        it directly in ``async with``."""
        body = create_body(
            template=template, size=size, timeout=timeout, metadata=metadata, env=env, network=network,
            idle_timeout=idle_timeout, persistent=persistent, always_on=always_on, wait=wait, extra=extra,
            snapshot_id=snapshot_id, runtime=runtime,
        )
        config = _connection(server, api_key, max_retries, request_timeout, headers)

        async def make() -> "AsyncSandbox":
            transport = AsyncTransport(config)
            try:
                data = await transport.data("POST", "/sandboxes", json=body)
            except BaseException:
                await transport.aclose()
                raise
            return cls(SandboxInfo.from_dict(data), transport)

        return _Creating(make)

    @classmethod
    async def connect(
        cls,
        sandbox_id: str,
        *,
        resume: bool = True,
        server: Optional[str] = None,
        api_key: Optional[str] = None,
        max_retries: Optional[int] = None,
        request_timeout: Optional[float] = None,
        headers: Optional[Dict[str, str]] = None,
    ) -> "AsyncSandbox":
        transport = AsyncTransport(_connection(server, api_key, max_retries, request_timeout, headers))
        try:
            sandbox = cls(SandboxInfo.from_dict(await transport.data("GET", sandbox_path(sandbox_id))), transport)
            if resume and sandbox.state in ("paused", "stopped"):
                await sandbox.resume()
        except BaseException:
            await transport.aclose()
            raise
        return sandbox

    @classmethod
    def list(
        cls,
        state: Optional[str] = None,
        metadata: Optional[Mapping[str, str]] = None,
        *,
        limit: Optional[int] = None,
        page_size: Optional[int] = None,
        server: Optional[str] = None,
        api_key: Optional[str] = None,
        max_retries: Optional[int] = None,
        request_timeout: Optional[float] = None,
        headers: Optional[Dict[str, str]] = None,
    ) -> "AsyncSandboxPages":
        """As :meth:`Sandbox.list`: ``await`` it for every sandbox as a list, or
        ``async for`` over it to read a page at a time."""
        config = _connection(server, api_key, max_retries, request_timeout, headers)
        return AsyncSandboxPages(config, state, metadata, limit, page_size)

    @classmethod
    async def run(
        cls,
        cmd: Optional[Command] = None,
        *,
        files: RunFiles = None,
        artifacts: Optional[Sequence[str]] = None,
        timeout: Optional[float] = None,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        user: Optional[str] = None,
        stdin: Union[str, bytes, None] = None,
        template: Optional[str] = None,
        size: Optional[str] = None,
        metadata: Optional[Mapping[str, str]] = None,
        network: NetworkArg = None,
        runtime: Optional[str] = None,
        check: bool = False,
        server: Optional[str] = None,
        api_key: Optional[str] = None,
        max_retries: Optional[int] = None,
        request_timeout: Optional[float] = None,
        headers: Optional[Dict[str, str]] = None,
    ) -> RunResult:
        """A one-shot run (``POST /api/v1/sandboxes/run``): a sandbox is created, ``files``
        written into it, ``cmd`` (a shell line or a list of arguments) run, the files matching
        the ``artifacts`` globs kept, and the sandbox destroyed, in one request.

        ``files`` maps paths (absolute, or relative to ``cwd``) to content (str, or bytes),
        or is a list of ``{"path", "content", "encoding"}`` objects. ``timeout`` is the
        command's, in seconds. Download the artifacts with :meth:`cella.Artifact.download`.
        ``check=True`` raises :class:`~cella.CommandExitError` for an exit code other than 0.
        ``runtime`` is the run's sandbox's, as for :meth:`create`.
        """
        body = run_body(cmd, files=files, artifacts=artifacts, template=template, size=size, env=env,
                        metadata=metadata, network=network, cwd=cwd, user=user, timeout=timeout, stdin=stdin,
                        runtime=runtime)
        transport = AsyncTransport(_connection(server, api_key, max_retries, request_timeout, headers))
        try:
            data = await transport.data("POST", "/sandboxes/run", json=body, timeout=run_http_timeout(timeout))
        finally:
            await transport.aclose()
        result = RunResult.from_dict(data)
        if check and not result.ok:
            raise CommandExitError(result.command_result())
        return result

    # ------------------------------------------------------------------ what it is

    @property
    def id(self) -> str:
        return self._info.id

    sandbox_id = id

    @property
    def info(self) -> SandboxInfo:
        return self._info

    @property
    def state(self) -> str:
        return self._info.state

    @property
    def connection(self) -> ConnectionConfig:
        return self._transport.config

    def _set(self, data: Mapping[str, Any]) -> SandboxInfo:
        self._info = SandboxInfo.from_dict(data)
        return self._info

    async def refresh(self) -> SandboxInfo:
        return self._set(await self._transport.data("GET", sandbox_path(self.id)))

    get_info = refresh

    async def is_running(self) -> bool:
        return (await self.refresh()).state == "running"

    async def wait_ready(self, timeout: float = 60.0, interval: float = 0.1) -> SandboxInfo:
        deadline = time.monotonic() + timeout
        while True:
            info = await self.refresh()
            if info.state == "running" and info.ready:
                return info
            if info.state in ("error", "destroyed", "stopped"):
                raise UnavailableError(
                    f"sandbox {self.id} is {info.state}" + (f": {info.state_reason}" if info.state_reason else ""),
                    details={"sandbox_id": self.id, "state": info.state},
                )
            if time.monotonic() >= deadline:
                raise CellaTimeoutError(f"sandbox {self.id} was not running after {timeout} s (state {info.state})")
            await asyncio.sleep(interval)

    # ------------------------------------------------------------------ lifecycle

    async def pause(self) -> SandboxInfo:
        return self._set(await self._transport.data("POST", sandbox_path(self.id, "pause")))

    async def resume(self) -> SandboxInfo:
        return self._set(await self._transport.data("POST", sandbox_path(self.id, "resume")))

    async def stop(self) -> SandboxInfo:
        return self._set(await self._transport.data("POST", sandbox_path(self.id, "stop")))

    async def kill(self) -> SandboxInfo:
        return self._set(await self._transport.data("DELETE", sandbox_path(self.id)))

    destroy = kill

    async def set_timeout(self, timeout: float) -> SandboxInfo:
        body = {"timeout_sec": whole_seconds(timeout, "timeout")}
        return self._set(await self._transport.data("POST", sandbox_path(self.id, "timeout"), json=body))

    async def usage(self) -> SandboxUsage:
        return SandboxUsage.from_dict(await self._transport.data("GET", sandbox_path(self.id, "usage")))

    async def create_snapshot(self, memory: Optional[bool] = None) -> SnapshotInfo:
        """Copy the sandbox's files into a snapshot (``POST .../snapshots``), from which
        ``create(snapshot_id=...)`` starts new sandboxes. A running sandbox is frozen only
        while the copy is taken. With ``memory=True`` (``gvisor`` sandboxes) its memory and
        processes too: sandboxes made from it continue where it was."""
        return SnapshotInfo.from_dict(await self._transport.data("POST", sandbox_path(self.id, "snapshots"), **snapshot_body(memory)))

    async def collect_artifacts(self, paths: Sequence[str]) -> List[ArtifactInfo]:
        """Keep files of the running sandbox as artifacts (globs or paths, relative to
        ``/home/user`` or absolute); they outlive the sandbox until they expire."""
        data = await self._transport.data("POST", sandbox_path(self.id, "artifacts"), json={"paths": [str(p) for p in paths]})
        return [ArtifactInfo.from_dict(d) for d in data or []]

    async def fork(self, count: int = 1, metadata: Optional[Mapping[str, str]] = None) -> List["AsyncSandbox"]:
        body: Dict[str, Any] = {"count": count}
        if metadata is not None:
            body["metadata"] = dict(metadata)
        data = await self._transport.data("POST", sandbox_path(self.id, "fork"), json=body)
        items = data if isinstance(data, list) else [data]
        return [AsyncSandbox(SandboxInfo.from_dict(d), AsyncTransport(self._transport.config)) for d in items]

    async def expose(self, port: int) -> str:
        return (await self.expose_info(port)).url

    async def expose_info(self, port: int) -> ExposedPort:
        data = await self._transport.data("POST", sandbox_path(self.id, "expose"), json={"port": int(port)})
        return ExposedPort.from_dict(data if isinstance(data, Mapping) else {"port": port, "url": str(data)})

    async def preview_token(self, ttl: Optional[float] = None, rotate: bool = False) -> Dict[str, Any]:
        """As :meth:`Sandbox.preview_token`."""
        body: Dict[str, Any] = {}
        if ttl is not None:
            body["ttl_sec"] = whole_seconds(ttl, "ttl")
        if rotate:
            body["rotate"] = True
        return dict(await self._transport.data("POST", sandbox_path(self.id, "preview-token"), json=body))

    async def get_host(self, port: int) -> str:
        """As :meth:`Sandbox.get_host`: the host of the port's own preview origin."""
        return _host_of(await self.expose_info(port))

    async def run_code(self, code: str, language: Optional[str] = None, context: Optional[str] = None, timeout: Optional[float] = None) -> Execution:
        return await self.code.run(code, language=language, context=context, timeout=timeout)

    # ------------------------------------------------------------------ the client

    async def close(self) -> None:
        await self._transport.aclose()

    async def __aenter__(self) -> "AsyncSandbox":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        try:
            await self.kill()
        except NotFoundError:
            pass
        finally:
            await self.close()

    def __repr__(self) -> str:
        return f"AsyncSandbox(id={self.id!r}, state={self.state!r})"


# ====================================================================== commands


class AsyncCommands:
    """Commands inside a sandbox: ``sandbox.commands``; see :class:`cella.Commands`."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sandbox = sandbox

    @property
    def _t(self) -> AsyncTransport:
        return self._sandbox._transport

    def _path(self, *rest: str) -> str:
        return sandbox_path(self._sandbox.id, *rest)

    async def run(
        self,
        cmd: Command,
        *,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        user: Optional[str] = None,
        timeout: Optional[float] = None,
        stdin: Union[str, bytes, None] = None,
        on_stdout: Callback = None,
        on_stderr: Callback = None,
        check: bool = False,
        background: bool = False,
        tag: Optional[str] = None,
    ) -> Any:
        """See :meth:`cella.Commands.run`; callbacks may be plain functions or coroutine
        functions."""
        if background:
            handle = await self.start(cmd, env=env, cwd=cwd, user=user, tag=tag)
            if stdin is not None:
                await handle.send_stdin(stdin, close=True)
            return handle
        body = command_body(cmd, env=env, cwd=cwd, user=user, timeout=timeout, stdin=stdin)
        if on_stdout is not None or on_stderr is not None:
            result = await self._run_streamed(body, timeout, on_stdout, on_stderr)
        else:
            data = await self._t.data("POST", self._path("exec"), json=body, timeout=exec_http_timeout(timeout))
            result = CommandResult.from_dict(data)
        if check and not result.ok:
            raise CommandExitError(result)
        return result

    async def _run_streamed(self, body: Dict[str, Any], timeout: Optional[float], on_stdout: Callback, on_stderr: Callback) -> CommandResult:
        async with self._t.stream("POST", self._path("exec", "stream"), json=body, timeout=exec_http_timeout(timeout)) as resp:
            collector = OutputCollector(resp.headers.get("x-request-id"))
            async for ev in _sse_events(resp):
                if ev is KEEPALIVE:
                    continue
                assert isinstance(ev, SSEEvent)
                chunk = collector.chunk(ev)
                if chunk is not None:
                    await _call(on_stdout if chunk.stream == "stdout" else on_stderr, chunk.text)
                if collector.exit is not None:
                    break
        if collector.exit is None:
            raise CellaError("the output stream ended before the command's exit", code="STREAM_ENDED", request_id=collector.request_id)
        return collector.result()

    async def start(
        self,
        cmd: Command,
        *,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        user: Optional[str] = None,
        tag: Optional[str] = None,
    ) -> "AsyncCommandHandle":
        body = command_body(cmd, env=env, cwd=cwd, user=user, tag=tag)
        data = await self._t.data("POST", self._path("processes"), json=body)
        return AsyncCommandHandle(self._sandbox, ProcessInfo.from_dict(data))

    async def list(self) -> List[ProcessInfo]:
        return [ProcessInfo.from_dict(d) for d in await self._t.data("GET", self._path("processes")) or []]

    async def get(self, pid: int) -> ProcessInfo:
        return ProcessInfo.from_dict(await self._t.data("GET", self._path("processes", seg(pid))))

    async def connect(self, pid: int) -> "AsyncCommandHandle":
        return AsyncCommandHandle(self._sandbox, await self.get(pid))

    async def signal(self, pid: int, signal: Union[str, int, Any] = "TERM") -> ProcessInfo:
        body = {"signal": signal_value(signal)}
        return ProcessInfo.from_dict(await self._t.data("POST", self._path("processes", seg(pid), "signal"), json=body))

    async def kill(self, pid: int) -> bool:
        try:
            await self.signal(pid, "KILL")
        except ConflictError:
            return False
        return True

    async def send_stdin(self, pid: int, data: Union[str, bytes], close: bool = False) -> ProcessInfo:
        content = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        params = {"close": "true"} if close else None
        return ProcessInfo.from_dict(
            await self._t.data("POST", self._path("processes", seg(pid), "stdin"), params=params, content=content,
                               headers={"Content-Type": "application/octet-stream"})
        )


class AsyncCommandHandle:
    """A background process; ``async for`` over it for its output, ``await wait()`` for its
    end."""

    def __init__(self, sandbox: AsyncSandbox, info: ProcessInfo) -> None:
        self._sandbox = sandbox
        self.info = info
        self.pid = info.pid
        self._result: Optional[CommandResult] = None

    @property
    def tag(self) -> Optional[str]:
        return self.info.tag

    @property
    def exit_code(self) -> Optional[int]:
        if self._result is not None:
            return self._result.exit_code
        return self.info.exit_code if self.info.state == "exited" else None

    async def refresh(self) -> ProcessInfo:
        self.info = await self._sandbox.commands.get(self.pid)
        return self.info

    async def signal(self, signal: Union[str, int, Any] = "TERM") -> ProcessInfo:
        return await self._sandbox.commands.signal(self.pid, signal)

    async def kill(self) -> bool:
        return await self._sandbox.commands.kill(self.pid)

    async def send_stdin(self, data: Union[str, bytes], close: bool = False) -> ProcessInfo:
        return await self._sandbox.commands.send_stdin(self.pid, data, close=close)

    async def close_stdin(self) -> ProcessInfo:
        return await self._sandbox.commands.send_stdin(self.pid, b"", close=True)

    async def _follow(self, from_start: bool, timeout: Optional[float], collector: OutputCollector) -> AsyncIterator[OutputChunk]:
        path = sandbox_path(self._sandbox.id, "processes", seg(self.pid), "output")
        params = {"from": "start" if from_start else "now"}
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            async with self._sandbox._transport.stream("GET", path, params=params, timeout=timeout) as resp:
                collector.request_id = resp.headers.get("x-request-id")
                async for ev in _sse_events(resp):
                    if isinstance(ev, SSEEvent):
                        chunk = collector.chunk(ev)
                        if chunk is not None:
                            yield chunk
                        if collector.exit is not None:
                            self._result = collector.result()
                            return
                    if deadline is not None and time.monotonic() > deadline:
                        break
        except CellaTimeoutError:
            pass
        if collector.exit is None:
            if deadline is not None:
                raise CellaTimeoutError(f"process {self.pid} did not exit within {timeout} s")
            raise CellaError("the output stream ended before the process exited", code="STREAM_ENDED", request_id=collector.request_id)

    def output(self, from_start: bool = True, timeout: Optional[float] = None) -> AsyncIterator[OutputChunk]:
        return self._follow(from_start, timeout, OutputCollector())

    def __aiter__(self) -> AsyncIterator[OutputChunk]:
        return self.output()

    async def wait(self, on_stdout: Callback = None, on_stderr: Callback = None, timeout: Optional[float] = None, check: bool = False) -> CommandResult:
        collector = OutputCollector()
        async for chunk in self._follow(True, timeout, collector):
            await _call(on_stdout if chunk.stream == "stdout" else on_stderr, chunk.text)
        result = collector.result()
        self._result = result
        if check and not result.ok:
            raise CommandExitError(result)
        return result

    def __repr__(self) -> str:
        return f"AsyncCommandHandle(pid={self.pid}, sandbox={self._sandbox.id!r})"


# ====================================================================== files


class AsyncFiles:
    """The sandbox's filesystem: ``sandbox.files``; see :class:`cella.Files`."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sandbox = sandbox

    @property
    def _t(self) -> AsyncTransport:
        return self._sandbox._transport

    def _path(self, *rest: str) -> str:
        return sandbox_path(self._sandbox.id, "files", *rest)

    async def read(self, path: str, format: str = "text", *, encoding: str = "utf-8") -> Any:
        """``format="text"``, ``"bytes"``, or ``"stream"`` (an async iterator of chunks)."""
        if format == "stream":
            return self._read_stream(path)
        if format not in ("text", "bytes"):
            raise ValueError('format must be "text", "bytes" or "stream"')
        data = (await self._t.request("GET", self._path(), params={"path": path})).content
        return data if format == "bytes" else data.decode(encoding)

    async def _read_stream(self, path: str) -> AsyncIterator[bytes]:
        async with self._t.stream("GET", self._path(), params={"path": path}) as resp:
            try:
                async for chunk in resp.aiter_bytes():
                    yield chunk
            except httpx.TransportError as exc:
                raise _wrap_transport_error(exc) from exc

    async def write(self, path: Union[str, Sequence[Mapping[str, Any]]], data: Union[str, bytes, bytearray, BinaryIO, None] = None, *, user: Optional[str] = None, mode: Union[int, str, None] = None) -> Any:
        """As :meth:`Files.write`: one file, or a list of ``{"path", "data"}`` entries."""
        if not isinstance(path, str):
            return [await self.write(f["path"], f["data"], user=f.get("user", user), mode=f.get("mode", mode)) for f in _write_entries(path)]
        if data is None:
            raise TypeError("write() needs the data to write")
        content: Any = data.encode("utf-8") if isinstance(data, str) else data
        params = {"path": path, "user": user, "mode": file_mode(mode)}
        return EntryInfo.from_dict(
            await self._t.data("PUT", self._path(), params=params, content=content, headers={"Content-Type": "application/octet-stream"})
        )

    async def list(self, path: str, recursive: bool = False, limit: Optional[int] = None) -> EntryList:
        params = {"path": path, "recursive": recursive or None, "limit": limit}
        page = (await self._t.request("GET", self._path("list"), params=params)).json()
        return EntryList((EntryInfo.from_dict(d) for d in page.get("data") or []), bool(page.get("truncated", False)))

    async def stat(self, path: str) -> EntryInfo:
        return EntryInfo.from_dict(await self._t.data("GET", self._path("stat"), params={"path": path}))

    get_info = stat

    async def exists(self, path: str) -> bool:
        try:
            await self.stat(path)
        except NotFoundError:
            return False
        return True

    async def remove(self, path: str, recursive: bool = False) -> None:
        await self._t.request("DELETE", self._path(), params={"path": path, "recursive": recursive or None})

    async def make_dir(self, path: str) -> EntryInfo:
        return EntryInfo.from_dict(await self._t.data("POST", self._path("mkdir"), json={"path": path}))

    async def rename(self, src: str, dst: str) -> EntryInfo:
        return EntryInfo.from_dict(await self._t.data("POST", self._path("move"), json={"from": src, "to": dst}))

    move = rename

    async def watch(self, path: str, recursive: bool = False, timeout: Optional[float] = None) -> "AsyncWatchHandle":
        """Follow the changes in a directory; the watch is in place when this returns.
        ``async for`` over the handle; close it (or ``async with`` it) when done."""
        params = {"path": path, "recursive": recursive or None}
        cm = self._t.stream("GET", self._path("watch"), params=params, timeout=timeout)
        resp = await cm.__aenter__()
        return AsyncWatchHandle(cm, resp, timeout)


class AsyncWatchHandle:
    """An open watch on a directory; ``async for`` for events."""

    def __init__(self, cm: Any, resp: httpx.Response, timeout: Optional[float]) -> None:
        self._cm = cm
        self._resp = resp
        self._timeout = timeout
        self._events = _sse_events(resp)
        self.closed = False

    async def _iterate(self) -> AsyncIterator[FilesystemEvent]:
        last = time.monotonic()
        while not self.closed:
            try:
                ev = await self._events.__anext__()
            except StopAsyncIteration:
                return
            except CellaTimeoutError:
                return
            if isinstance(ev, SSEEvent) and ev.event in ("create", "modify", "delete", "rename"):
                last = time.monotonic()
                yield FilesystemEvent.from_sse(ev.event, ev.json() or {})
            elif isinstance(ev, SSEEvent) and ev.event == "error":
                raise stream_error(ev, self._resp.headers.get("x-request-id"))
            elif self._timeout is not None and time.monotonic() - last > self._timeout:
                return

    def __aiter__(self) -> AsyncIterator[FilesystemEvent]:
        return self._iterate()

    async def close(self) -> None:
        if not self.closed:
            self.closed = True
            try:
                await self._events.aclose()
            finally:
                await self._cm.__aexit__(None, None, None)

    async def __aenter__(self) -> "AsyncWatchHandle":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


# ====================================================================== code interpreter


class AsyncCodeInterpreter:
    """Persistent interpreters: ``sandbox.code``; see :class:`cella.CodeInterpreter`."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sandbox = sandbox

    @property
    def _t(self) -> AsyncTransport:
        return self._sandbox._transport

    def _path(self, *rest: str) -> str:
        return sandbox_path(self._sandbox.id, "code", *rest)

    async def run(self, code: str, language: Optional[str] = None, context: Optional[str] = None, timeout: Optional[float] = None) -> Execution:
        data = await self._t.data("POST", self._path("run"), json=code_body(code, language, context, timeout), timeout=code_http_timeout(timeout))
        return Execution.from_dict(data)

    async def state(self) -> List[KernelInfo]:
        data = await self._t.data("GET", self._path())
        return [KernelInfo.from_dict(k) for k in (data or {}).get("kernels") or []]

    async def contexts(self, language: Optional[str] = None) -> List[CodeContext]:
        data = await self._t.data("GET", self._path("contexts"), params={"language": language})
        return [CodeContext(d["name"], d["language"]) for d in data or []]

    async def create_context(self, name: Optional[str] = None, language: Optional[str] = None) -> CodeContext:
        body: Dict[str, Any] = {}
        if name is not None:
            body["context"] = name
        if language is not None:
            body["language"] = language
        data = await self._t.data("POST", self._path("contexts"), json=body)
        return CodeContext(data["name"], data["language"])

    async def reset_context(self, name: str, language: Optional[str] = None) -> bool:
        data = await self._t.data("DELETE", self._path("contexts", seg(name)), params={"language": language})
        return bool(data.get("changed"))

    async def reset(self, language: Optional[str] = None) -> List[KernelInfo]:
        data = await self._t.data("DELETE", self._path(), params={"language": language})
        return [KernelInfo.from_dict(k) for k in (data or {}).get("kernels") or []]
