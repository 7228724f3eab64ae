"""The blocking client: :class:`Sandbox` and what hangs off it (commands, files, code)."""

from __future__ import annotations

import time
from typing import Any, BinaryIO, Dict, Generator, Iterator, List, Mapping, Optional, Sequence, Union

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
from .pty import Pty
from ._sse import KEEPALIVE, KeepAlive, LineSplitter, SSEDecoder, SSEEvent
from ._transport import SyncTransport, _wrap_transport_error
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

__all__ = ["Sandbox", "Commands", "CommandHandle", "Files", "WatchHandle", "CodeInterpreter"]


def _sse_events(resp: httpx.Response) -> Generator[Union[SSEEvent, KeepAlive], None, None]:
    """The events of a streamed answer, and :data:`KEEPALIVE` for each comment line."""
    lines = LineSplitter()
    decoder = SSEDecoder()
    try:
        for chunk in resp.iter_bytes():
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


class SandboxPages:
    """A listing of sandboxes, read a page at a time as it is iterated. ``len()``, indexing,
    ``==`` and ``list()`` read it whole (once)."""

    def __init__(self, config: ConnectionConfig, state: Optional[str], metadata: Optional[Mapping[str, str]], limit: Optional[int], page_size: Optional[int]) -> None:
        self._config, self._state, self._metadata = config, state, dict(metadata or {})
        self._limit, self._page_size = limit, page_size
        self._all: Optional[List[SandboxInfo]] = None
        self._first = self._page(None, 0)  # errors surface at the call

    def _page(self, cursor: Optional[str], have: int) -> Dict[str, Any]:
        transport = SyncTransport(self._config)
        try:
            params = _list_params(self._state, self._metadata, self._limit, have, cursor, self._page_size)
            return transport.request("GET", "/sandboxes", params=params).json()
        finally:
            transport.close()

    def __iter__(self) -> Iterator[SandboxInfo]:
        if self._all is not None:
            yield from self._all
            return
        page, found = self._first, 0
        while True:
            for d in page.get("data") or []:
                if self._limit is not None and found >= self._limit:
                    return
                found += 1
                yield SandboxInfo.from_dict(d)
            cursor = page.get("next_cursor")
            if not cursor or (self._limit is not None and found >= self._limit):
                return
            page = self._page(cursor, found)

    def all(self) -> List[SandboxInfo]:
        """Every sandbox of the listing, reading the pages not read yet."""
        if self._all is None:
            self._all = [s for s in self]
        return self._all

    def __len__(self) -> int:
        return len(self.all())

    def __getitem__(self, i: Any) -> Any:
        return self.all()[i]

    def __eq__(self, other: object) -> bool:
        return self.all() == (other.all() if isinstance(other, SandboxPages) else other)

    def __repr__(self) -> str:
        return f"SandboxPages({self.all()!r})"


def _host_of(exposed: ExposedPort) -> str:
    """The ``host[:port]`` of an exposed port's host-name URL."""
    from urllib.parse import urlsplit

    return urlsplit(exposed.host_url or exposed.url).netloc


def _write_entries(files: Any) -> List[Mapping[str, Any]]:
    """The entries of a multi-file write: mappings with ``path`` and ``data``."""
    out = []
    for f in files:
        if not isinstance(f, Mapping) or "path" not in f or "data" not in f:
            raise TypeError("write() takes a path and data, or a list of {'path', 'data'} entries")
        unknown = set(f) - {"path", "data", "user", "mode"}
        if unknown:
            raise TypeError(f"write(): unknown entry keys {sorted(unknown)}")
        out.append(f)
    return out


def _connection(server: Optional[str], api_key: Optional[str], max_retries: Optional[int], request_timeout: Optional[float], headers: Optional[Dict[str, str]]) -> ConnectionConfig:
    return ConnectionConfig.resolve(server=server, api_key=api_key, max_retries=max_retries, request_timeout=request_timeout, headers=headers)


class Sandbox:
    """A sandbox on a Cella server, driven with blocking calls.

    Make one with :meth:`create` (or attach to one with :meth:`connect`); used as a context
    manager, it is destroyed when the block ends::

        with Sandbox.create() as sb:
            print(sb.commands.run("echo hi").stdout)
    """

    def __init__(self, info: SandboxInfo, transport: SyncTransport) -> None:
        self._info = info
        self._transport = transport
        self.commands = Commands(self)
        self.files = Files(self)
        self.code = CodeInterpreter(self)
        self.pty = Pty(self)

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
    ) -> "Sandbox":
        """Create a sandbox and (unless ``wait=False``) wait until it runs.

        ``template`` defaults to the server's ``base``, ``size`` to the template's default;
        ``timeout`` is the active-session timeout in seconds (default 3600); ``network`` is
        the egress policy (``{"egress": "deny", "allow": [...]}`` or a
        :class:`~cella.NetworkPolicy`). ``runtime`` is the isolation runtime, ``"namespace"`` or
        ``"gvisor"`` (default: the template's, then the server's; ``gvisor`` needs ``runsc`` on the
        server). ``extra`` adds raw fields to the request body.
        """
        body = create_body(
            template=template, size=size, timeout=timeout, metadata=metadata, env=env, network=network,
            idle_timeout=idle_timeout, persistent=persistent, always_on=always_on, wait=wait, extra=extra,
            snapshot_id=snapshot_id, runtime=runtime,
        )
        transport = SyncTransport(_connection(server, api_key, max_retries, request_timeout, headers))
        try:
            data = transport.data("POST", "/sandboxes", json=body)
        except BaseException:
            transport.close()
            raise
        return cls(SandboxInfo.from_dict(data), transport)

    @classmethod
    def connect(
        cls,
        sandbox_id: str,
        *,
        resume: bool = True,
        server: Optional[str] = None,
        api_key: Optional[str] = None,
        max_retries: Optional[int] = None,
        request_timeout: Optional[float] = None,
        headers: Optional[Dict[str, str]] = None,
    ) -> "Sandbox":
        """Attach to an existing sandbox. A ``paused`` or ``stopped`` one is resumed first
        (as in the TypeScript SDK), unless ``resume=False``."""
        transport = SyncTransport(_connection(server, api_key, max_retries, request_timeout, headers))
        try:
            sandbox = cls(SandboxInfo.from_dict(transport.data("GET", sandbox_path(sandbox_id))), transport)
            if resume and sandbox.state in ("paused", "stopped"):
                sandbox.resume()
        except BaseException:
            transport.close()
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
    ) -> "SandboxPages":
        """The workspace's live sandboxes (not destroyed or failed), newest first, unless
        ``state`` picks one (or ``"all"``); ``metadata`` keeps those whose metadata has every
        entry given. Lazy: the first page is read now (so a bad filter raises here), later
        pages (of ``page_size``, at most 1000) as the iteration reaches them, until the end or
        ``limit`` sandboxes; ``len()``, indexing and ``==`` read it whole."""
        config = _connection(server, api_key, max_retries, request_timeout, headers)
        return SandboxPages(config, state, metadata, limit, page_size)

    @classmethod
    def run(
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
        transport = SyncTransport(_connection(server, api_key, max_retries, request_timeout, headers))
        try:
            data = transport.data("POST", "/sandboxes/run", json=body, timeout=run_http_timeout(timeout))
        finally:
            transport.close()
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
        """The sandbox as last seen (updated by every call that answers it; see
        :meth:`refresh`)."""
        return self._info

    @property
    def state(self) -> str:
        return self._info.state

    @property
    def connection(self) -> ConnectionConfig:
        return self._transport.config

    def refresh(self) -> SandboxInfo:
        """Read the sandbox again from the server."""
        return self._set(self._transport.data("GET", sandbox_path(self.id)))

    get_info = refresh

    def is_running(self) -> bool:
        return self.refresh().state == "running"

    def wait_ready(self, timeout: float = 60.0, interval: float = 0.1) -> SandboxInfo:
        """Poll until the sandbox runs (after ``create(wait=False)``)."""
        deadline = time.monotonic() + timeout
        while True:
            info = self.refresh()
            if info.state == "running" and info.ready:
                return info
            if info.state in ("error", "destroyed", "stopped"):
                raise UnavailableError(
                    f"sandbox {self.id} is {info.state}" + (f": {info.state_reason}" if info.state_reason else ""),
                    details={"sandbox_id": self.id, "state": info.state},
                )
            if time.monotonic() >= deadline:
                raise CellaTimeoutError(f"sandbox {self.id} was not running after {timeout} s (state {info.state})")
            time.sleep(interval)

    def _set(self, data: Mapping[str, Any]) -> SandboxInfo:
        self._info = SandboxInfo.from_dict(data)
        return self._info

    # ------------------------------------------------------------------ lifecycle

    def pause(self) -> SandboxInfo:
        """Freeze every process (memory kept). Only from ``running``."""
        return self._set(self._transport.data("POST", sandbox_path(self.id, "pause")))

    def resume(self) -> SandboxInfo:
        """Thaw a paused sandbox, or boot a stopped one again on its kept files."""
        return self._set(self._transport.data("POST", sandbox_path(self.id, "resume")))

    def stop(self) -> SandboxInfo:
        """End every process and keep the files (persistent sandboxes only)."""
        return self._set(self._transport.data("POST", sandbox_path(self.id, "stop")))

    def kill(self) -> SandboxInfo:
        """Destroy the sandbox (idempotent). Its files are gone."""
        return self._set(self._transport.data("DELETE", sandbox_path(self.id)))

    destroy = kill

    def set_timeout(self, timeout: float) -> SandboxInfo:
        """Set the active-session timeout, in seconds; on a running sandbox the timer
        restarts from now."""
        body = {"timeout_sec": whole_seconds(timeout, "timeout")}
        return self._set(self._transport.data("POST", sandbox_path(self.id, "timeout"), json=body))

    def usage(self) -> SandboxUsage:
        return SandboxUsage.from_dict(self._transport.data("GET", sandbox_path(self.id, "usage")))

    def create_snapshot(self, memory: Optional[bool] = None) -> SnapshotInfo:
        """Copy the sandbox's files into a snapshot (``POST .../snapshots``), from which
        ``create(snapshot_id=...)`` starts new sandboxes. A running sandbox is frozen only
        while the copy is taken. With ``memory=True`` (``gvisor`` sandboxes; on ``namespace``
        an :class:`InvalidRequestError` naming ``memory``) its memory and processes too:
        sandboxes made from it continue where it was."""
        return SnapshotInfo.from_dict(self._transport.data("POST", sandbox_path(self.id, "snapshots"), **snapshot_body(memory)))

    def collect_artifacts(self, paths: Sequence[str]) -> List[ArtifactInfo]:
        """Keep files of the running sandbox as artifacts (globs or paths, relative to
        ``/home/user`` or absolute); they outlive the sandbox until they expire."""
        data = self._transport.data("POST", sandbox_path(self.id, "artifacts"), json={"paths": [str(p) for p in paths]})
        return [ArtifactInfo.from_dict(d) for d in data or []]

    def fork(self, count: int = 1, metadata: Optional[Mapping[str, str]] = None) -> List["Sandbox"]:
        """Copies of this sandbox (``POST .../fork``), each a new :class:`Sandbox`."""
        body: Dict[str, Any] = {"count": count}
        if metadata is not None:
            body["metadata"] = dict(metadata)
        data = self._transport.data("POST", sandbox_path(self.id, "fork"), json=body)
        items = data if isinstance(data, list) else [data]
        return [Sandbox(SandboxInfo.from_dict(d), SyncTransport(self._transport.config)) for d in items]

    def expose(self, port: int) -> str:
        """The URL at which a port inside the sandbox is reachable through the server's
        preview proxy: the path form on the server's address while its preview domain is
        ``localhost`` (so httpx and requests open it; browsers are sent on to the sandbox's own
        host name), the host-name form otherwise (see :meth:`expose_info` for every form)."""
        return self.expose_info(port).url

    def expose_info(self, port: int) -> ExposedPort:
        """Every address of a port inside the sandbox (``POST .../expose``)."""
        data = self._transport.data("POST", sandbox_path(self.id, "expose"), json={"port": int(port)})
        return ExposedPort.from_dict(data if isinstance(data, Mapping) else {"port": port, "url": str(data)})

    def preview_token(self, ttl: Optional[float] = None, rotate: bool = False) -> Dict[str, Any]:
        """A token that opens the sandbox's private previews (``POST .../preview-token``):
        ``{"token", "expires_at"}``. ``ttl`` in seconds; ``rotate=True`` revokes the earlier
        ones."""
        body: Dict[str, Any] = {}
        if ttl is not None:
            body["ttl_sec"] = whole_seconds(ttl, "ttl")
        if rotate:
            body["rotate"] = True
        return dict(self._transport.data("POST", sandbox_path(self.id, "preview-token"), json=body))

    def get_host(self, port: int) -> str:
        """The host name (and port) of a port's own preview origin, ``<port>-<id>.<domain>``,
        without a scheme (E2B's ``get_host``). Browsers open it; for programs on a
        ``localhost`` preview domain, :meth:`expose`'s URL is the one to use."""
        return _host_of(self.expose_info(port))

    def run_code(self, code: str, language: Optional[str] = None, context: Optional[str] = None, timeout: Optional[float] = None) -> Execution:
        """Run a cell in the sandbox's code interpreter (see :class:`CodeInterpreter`)."""
        return self.code.run(code, language=language, context=context, timeout=timeout)

    # ------------------------------------------------------------------ the client

    def close(self) -> None:
        """Close the HTTP connections (the sandbox itself is left as it is)."""
        self._transport.close()

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self.kill()
        except NotFoundError:
            pass
        finally:
            self.close()

    def __repr__(self) -> str:
        return f"Sandbox(id={self.id!r}, state={self.state!r})"


def _list_params(state: Optional[str], metadata: Optional[Mapping[str, str]], limit: Optional[int], have: int, cursor: Optional[str], page_size: Optional[int]) -> List[Any]:
    params: List[Any] = []
    if state is not None:
        params.append(("state", state))
    for key, value in (metadata or {}).items():
        params.append((f"metadata.{key}", value))
    size = page_size
    if limit is not None:
        size = min(size or 1000, limit - have)
    if size is not None:
        params.append(("limit", max(1, min(1000, size))))
    if cursor:
        params.append(("cursor", cursor))
    return params


# ====================================================================== commands


class Commands:
    """Commands inside a sandbox: ``sandbox.commands``."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sandbox = sandbox

    @property
    def _t(self) -> SyncTransport:
        return self._sandbox._transport

    def _path(self, *rest: str) -> str:
        return sandbox_path(self._sandbox.id, *rest)

    def run(
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
        """Run a command to its end and answer a :class:`~cella.CommandResult`.

        ``cmd`` is a shell line (run by ``bash -c``) or a list of arguments. ``user`` is
        ``"user"`` (default) or ``"root"``; ``timeout`` is in seconds (the server's default
        is 3600); ``stdin`` is text written to its standard input. With ``on_stdout`` or
        ``on_stderr`` the output is streamed and each callback gets every piece of text as
        it comes. ``check=True`` raises :class:`~cella.CommandExitError` for an exit code
        other than 0. ``background=True`` is :meth:`start`.
        """
        if background:
            handle = self.start(cmd, env=env, cwd=cwd, user=user, tag=tag)
            if stdin is not None:
                handle.send_stdin(stdin, close=True)
            return handle
        body = command_body(cmd, env=env, cwd=cwd, user=user, timeout=timeout, stdin=stdin)
        if on_stdout is not None or on_stderr is not None:
            result = self._run_streamed(body, timeout, on_stdout, on_stderr)
        else:
            data = self._t.data("POST", self._path("exec"), json=body, timeout=exec_http_timeout(timeout))
            result = CommandResult.from_dict(data)
        if check and not result.ok:
            raise CommandExitError(result)
        return result

    def _run_streamed(self, body: Dict[str, Any], timeout: Optional[float], on_stdout: Callback, on_stderr: Callback) -> CommandResult:
        with self._t.stream("POST", self._path("exec", "stream"), json=body, timeout=exec_http_timeout(timeout)) as resp:
            collector = OutputCollector(resp.headers.get("x-request-id"))
            for ev in _sse_events(resp):
                if ev is KEEPALIVE:
                    continue
                assert isinstance(ev, SSEEvent)
                chunk = collector.chunk(ev)
                if chunk is not None:
                    callback = on_stdout if chunk.stream == "stdout" else on_stderr
                    if callback is not None:
                        callback(chunk.text)
                if collector.exit is not None:
                    break
        if collector.exit is None:
            raise CellaError("the output stream ended before the command's exit", code="STREAM_ENDED", request_id=collector.request_id)
        return collector.result()

    def start(
        self,
        cmd: Command,
        *,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        user: Optional[str] = None,
        tag: Optional[str] = None,
    ) -> "CommandHandle":
        """Start a background process (no timeout of its own) and answer its handle."""
        body = command_body(cmd, env=env, cwd=cwd, user=user, tag=tag)
        return CommandHandle(self._sandbox, ProcessInfo.from_dict(self._t.data("POST", self._path("processes"), json=body)))

    def list(self) -> List[ProcessInfo]:
        """The background processes started through the API (running, and the last ones
        that exited)."""
        return [ProcessInfo.from_dict(d) for d in self._t.data("GET", self._path("processes")) or []]

    def get(self, pid: int) -> ProcessInfo:
        return ProcessInfo.from_dict(self._t.data("GET", self._path("processes", seg(pid))))

    def connect(self, pid: int) -> "CommandHandle":
        """A handle on a background process started earlier."""
        return CommandHandle(self._sandbox, self.get(pid))

    def signal(self, pid: int, signal: Union[str, int, Any] = "TERM") -> ProcessInfo:
        body = {"signal": signal_value(signal)}
        return ProcessInfo.from_dict(self._t.data("POST", self._path("processes", seg(pid), "signal"), json=body))

    def kill(self, pid: int) -> bool:
        """SIGKILL a background process; False if it had exited already."""
        try:
            self.signal(pid, "KILL")
        except ConflictError:
            return False
        return True

    def send_stdin(self, pid: int, data: Union[str, bytes], close: bool = False) -> ProcessInfo:
        """Write to a background process's standard input (``close=True`` closes it after)."""
        content = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        params = {"close": "true"} if close else None
        return ProcessInfo.from_dict(
            self._t.data("POST", self._path("processes", seg(pid), "stdin"), params=params, content=content,
                         headers={"Content-Type": "application/octet-stream"})
        )


class CommandHandle:
    """A background process: iterate over it for its output, :meth:`wait` for its end."""

    def __init__(self, sandbox: Sandbox, info: ProcessInfo) -> None:
        self._sandbox = sandbox
        self.info = info
        self.pid = info.pid
        self._result: Optional[CommandResult] = None

    @property
    def tag(self) -> Optional[str]:
        return self.info.tag

    @property
    def exit_code(self) -> Optional[int]:
        """The exit code once known (after :meth:`wait`, the end of the output, or a
        :meth:`refresh` that saw it exit)."""
        if self._result is not None:
            return self._result.exit_code
        return self.info.exit_code if self.info.state == "exited" else None

    def refresh(self) -> ProcessInfo:
        self.info = self._sandbox.commands.get(self.pid)
        return self.info

    def signal(self, signal: Union[str, int, Any] = "TERM") -> ProcessInfo:
        """Send a signal (a name like ``"TERM"``, a number, or a ``signal.Signals``)."""
        return self._sandbox.commands.signal(self.pid, signal)

    def kill(self) -> bool:
        """SIGKILL the process; False if it had exited already."""
        return self._sandbox.commands.kill(self.pid)

    def send_stdin(self, data: Union[str, bytes], close: bool = False) -> ProcessInfo:
        return self._sandbox.commands.send_stdin(self.pid, data, close=close)

    def close_stdin(self) -> ProcessInfo:
        return self._sandbox.commands.send_stdin(self.pid, b"", close=True)

    def _follow(self, from_start: bool, timeout: Optional[float], collector: OutputCollector) -> Iterator[OutputChunk]:
        path = sandbox_path(self._sandbox.id, "processes", seg(self.pid), "output")
        params = {"from": "start" if from_start else "now"}
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            with self._sandbox._transport.stream("GET", path, params=params, timeout=timeout) as resp:
                collector.request_id = resp.headers.get("x-request-id")
                for ev in _sse_events(resp):
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

    def output(self, from_start: bool = True, timeout: Optional[float] = None) -> Iterator[OutputChunk]:
        """Follow the output until the process exits: what the buffer holds first (unless
        ``from_start=False``), then each new piece as it comes."""
        return self._follow(from_start, timeout, OutputCollector())

    def __iter__(self) -> Iterator[OutputChunk]:
        return self.output()

    def wait(self, on_stdout: Callback = None, on_stderr: Callback = None, timeout: Optional[float] = None, check: bool = False) -> CommandResult:
        """Wait for the process to exit and answer its result (output from the start of its
        buffer). Raises :class:`~cella.CellaTimeoutError` after ``timeout`` seconds."""
        collector = OutputCollector()
        for chunk in self._follow(True, timeout, collector):
            callback = on_stdout if chunk.stream == "stdout" else on_stderr
            if callback is not None:
                callback(chunk.text)
        result = collector.result()
        self._result = result
        if check and not result.ok:
            raise CommandExitError(result)
        return result

    def __repr__(self) -> str:
        return f"CommandHandle(pid={self.pid}, sandbox={self._sandbox.id!r})"


# ====================================================================== files


class Files:
    """The sandbox's filesystem: ``sandbox.files``. Paths are absolute paths inside it."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sandbox = sandbox

    @property
    def _t(self) -> SyncTransport:
        return self._sandbox._transport

    def _path(self, *rest: str) -> str:
        return sandbox_path(self._sandbox.id, "files", *rest)

    def read(self, path: str, format: str = "text", *, encoding: str = "utf-8") -> Any:
        """A file's content: ``format="text"`` (a str), ``"bytes"``, or ``"stream"`` (an
        iterator of byte chunks, read as they come)."""
        if format == "stream":
            return self._read_stream(path)
        if format not in ("text", "bytes"):
            raise ValueError('format must be "text", "bytes" or "stream"')
        data = self._t.request("GET", self._path(), params={"path": path}).content
        return data if format == "bytes" else data.decode(encoding)

    def _read_stream(self, path: str) -> Iterator[bytes]:
        with self._t.stream("GET", self._path(), params={"path": path}) as resp:
            try:
                for chunk in resp.iter_bytes():
                    yield chunk
            except httpx.TransportError as exc:
                raise _wrap_transport_error(exc) from exc

    def write(self, path: Union[str, Sequence[Mapping[str, Any]]], data: Union[str, bytes, bytearray, BinaryIO, None] = None, *, user: Optional[str] = None, mode: Union[int, str, None] = None) -> Any:
        """Write a file (whole or nothing; missing parents are made). ``data`` is text,
        bytes or a binary file object; ``mode`` like ``0o755``; ``user`` owns it.
        ``write([{"path": ..., "data": ...}, ...])`` writes several (each may give its own
        ``user`` and ``mode``) and returns their entries."""
        if not isinstance(path, str):
            return [self.write(f["path"], f["data"], user=f.get("user", user), mode=f.get("mode", mode)) for f in _write_entries(path)]
        if data is None:
            raise TypeError("write() needs the data to write")
        content: Any = data.encode("utf-8") if isinstance(data, str) else data
        params = {"path": path, "user": user, "mode": file_mode(mode)}
        return EntryInfo.from_dict(
            self._t.data("PUT", self._path(), params=params, content=content, headers={"Content-Type": "application/octet-stream"})
        )

    def list(self, path: str, recursive: bool = False, limit: Optional[int] = None) -> EntryList:
        """A directory's entries (the whole tree with ``recursive=True``), sorted by path."""
        params = {"path": path, "recursive": recursive or None, "limit": limit}
        page = self._t.request("GET", self._path("list"), params=params).json()
        return EntryList((EntryInfo.from_dict(d) for d in page.get("data") or []), bool(page.get("truncated", False)))

    def stat(self, path: str) -> EntryInfo:
        """One path's entry (a symlink is described, not followed)."""
        return EntryInfo.from_dict(self._t.data("GET", self._path("stat"), params={"path": path}))

    get_info = stat

    def exists(self, path: str) -> bool:
        try:
            self.stat(path)
        except NotFoundError:
            return False
        return True

    def remove(self, path: str, recursive: bool = False) -> None:
        """Remove a file, a link or an empty directory (any directory with ``recursive``)."""
        self._t.request("DELETE", self._path(), params={"path": path, "recursive": recursive or None})

    def make_dir(self, path: str) -> EntryInfo:
        """Make a directory and its missing parents (fine if it exists)."""
        return EntryInfo.from_dict(self._t.data("POST", self._path("mkdir"), json={"path": path}))

    def rename(self, src: str, dst: str) -> EntryInfo:
        """Move ``src`` to ``dst`` (replacing a file there); answers the entry at ``dst``."""
        return EntryInfo.from_dict(self._t.data("POST", self._path("move"), json={"from": src, "to": dst}))

    move = rename

    def watch(self, path: str, recursive: bool = False, timeout: Optional[float] = None) -> "WatchHandle":
        """Follow the changes in a directory. The watch is in place when this returns;
        iterate over the handle for :class:`~cella.FilesystemEvent` s. With ``timeout``,
        iteration ends once no event came for that many seconds. Close it (or use it as a
        context manager) when done."""
        params = {"path": path, "recursive": recursive or None}
        cm = self._t.stream("GET", self._path("watch"), params=params, timeout=timeout)
        resp = cm.__enter__()
        return WatchHandle(cm, resp, timeout)


class WatchHandle:
    """An open watch on a directory; iterate for events."""

    def __init__(self, cm: Any, resp: httpx.Response, timeout: Optional[float]) -> None:
        self._cm = cm
        self._resp = resp
        self._timeout = timeout
        self._events = _sse_events(resp)
        self.closed = False

    def __iter__(self) -> Iterator[FilesystemEvent]:
        last = time.monotonic()
        while not self.closed:
            try:
                ev = next(self._events)
            except StopIteration:
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

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            try:
                self._events.close()
            finally:
                self._cm.__exit__(None, None, None)

    def __enter__(self) -> "WatchHandle":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass


# ====================================================================== code interpreter


class CodeInterpreter:
    """Persistent Python and JavaScript interpreters: ``sandbox.code``. Variables, imports
    and definitions live on between cells of one context."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sandbox = sandbox

    @property
    def _t(self) -> SyncTransport:
        return self._sandbox._transport

    def _path(self, *rest: str) -> str:
        return sandbox_path(self._sandbox.id, "code", *rest)

    def run(self, code: str, language: Optional[str] = None, context: Optional[str] = None, timeout: Optional[float] = None) -> Execution:
        """Run a cell. ``language`` is ``"python"`` (default) or ``"javascript"``;
        ``context`` names the namespace (default ``"default"``); ``timeout`` in seconds
        (capped at 300 by the server) interrupts the cell, the context survives."""
        data = self._t.data("POST", self._path("run"), json=code_body(code, language, context, timeout), timeout=code_http_timeout(timeout))
        return Execution.from_dict(data)

    def state(self) -> List[KernelInfo]:
        """Which interpreters run, their contexts, busy or idle."""
        data = self._t.data("GET", self._path())
        return [KernelInfo.from_dict(k) for k in (data or {}).get("kernels") or []]

    def contexts(self, language: Optional[str] = None) -> List[CodeContext]:
        data = self._t.data("GET", self._path("contexts"), params={"language": language})
        return [CodeContext(d["name"], d["language"]) for d in data or []]

    def create_context(self, name: Optional[str] = None, language: Optional[str] = None) -> CodeContext:
        body: Dict[str, Any] = {}
        if name is not None:
            body["context"] = name
        if language is not None:
            body["language"] = language
        data = self._t.data("POST", self._path("contexts"), json=body)
        return CodeContext(data["name"], data["language"])

    def reset_context(self, name: str, language: Optional[str] = None) -> bool:
        """Forget a context's variables; True if it existed."""
        data = self._t.data("DELETE", self._path("contexts", seg(name)), params={"language": language})
        return bool(data.get("changed"))

    def reset(self, language: Optional[str] = None) -> List[KernelInfo]:
        """End a language's interpreter, and every context of it, for a fresh start."""
        data = self._t.data("DELETE", self._path(), params={"language": language})
        return [KernelInfo.from_dict(k) for k in (data or {}).get("kernels") or []]
