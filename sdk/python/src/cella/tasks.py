"""Task runs: an agent works on a repository in a fresh sandbox, on a new branch that is
handed back (pushed, and opened as a draft pull request on GitHub or GitLab).

:class:`Task` has the blocking calls, :class:`AsyncTask` the same on asyncio::

    from cella import Task

    run = Task.start("acme/web", "Make the greeting greet the tasks.")
    for event in Task.events(run.id):          # state and progress, until the run ends
        print(event.event, event.state or event.raw)
    print(Task.get(run.id).branch)

Every call takes the connection keywords of :meth:`cella.Sandbox.create` (``server``,
``api_key``, ``max_retries``, ``request_timeout``, ``headers``). Task runs need the scopes
``tasks:read`` / ``tasks:write`` and a workspace whose ``settings.tasks_enabled`` is true
(see :meth:`cella.Workspace.update`).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator, Callable, Dict, Iterator, List, Mapping, Optional, Union

from ._common import seg, stream_error
from ._sse import SSEEvent
from .async_resources import connect as aconnect, list_pages as alist_pages
from .errors import CellaTimeoutError
from .models import TaskEvent, TaskInfo, TaskLogChunk
from .resources import connect, list_pages

__all__ = ["Task", "AsyncTask"]

TaskRef = Union[str, TaskInfo]
EventCallback = Optional[Callable[[TaskEvent], Any]]


def task_id(ref: TaskRef) -> str:
    return ref.id if isinstance(ref, TaskInfo) else str(ref)


def start_body(repository: str, task: str, base_branch: Optional[str], forge: Optional[str], agent: Optional[str],
               metadata: Optional[Mapping[str, str]]) -> Dict[str, Any]:
    body: Dict[str, Any] = {"repository": repository, "task": task}
    if base_branch is not None:
        body["base_branch"] = base_branch
    if forge is not None:
        body["forge"] = forge
    if agent is not None:
        body["agent"] = agent
    if metadata is not None:
        body["metadata"] = dict(metadata)
    return body


def _event(ev: SSEEvent, request_id: Optional[str]) -> Optional[TaskEvent]:
    """The task event an SSE event carries; raises for an ``error`` event."""
    if ev.event == "error":
        raise stream_error(ev, request_id)
    if ev.event in ("state", "progress") or ev.event == "message":
        return TaskEvent.from_sse(ev.event, ev.json())
    return None


def _log_chunk(ev: SSEEvent, request_id: Optional[str]) -> Optional[TaskLogChunk]:
    if ev.event == "error":
        raise stream_error(ev, request_id)
    if ev.event == "output":
        d = ev.json() or {}
        return TaskLogChunk(stream=str(d.get("stream") or "stdout"), text=str(d.get("text") or ""))
    return None


def _stream_timeout(timeout: Optional[float]) -> Optional[float]:
    return None if timeout is None else float(timeout)


class Task:
    """The workspace's task runs, with blocking calls. Each method takes a run's id or its
    :class:`~cella.TaskInfo`."""

    @staticmethod
    def start(repository: str, task: str, *, base_branch: Optional[str] = None, forge: Optional[str] = None,
              agent: Optional[str] = None, metadata: Optional[Mapping[str, str]] = None, **connection: Any) -> TaskInfo:
        """Start a run (``POST /api/v1/tasks``): answers it ``queued``. ``base_branch``
        defaults to the repository's default branch, ``forge`` and ``agent`` to the server's
        first. Raises :class:`~cella.PermissionDeniedError` when the workspace's task runs are
        off (``details.reason == "tasks_disabled"``), :class:`~cella.InsufficientFundsError`
        when its wallet cannot cover the run, :class:`~cella.NotFoundError` for a repository
        or base branch the forge does not have."""
        t = connect(**connection)
        try:
            return TaskInfo.from_dict(t.data("POST", "/tasks", json=start_body(repository, task, base_branch, forge, agent, metadata)))
        finally:
            t.close()

    @staticmethod
    def list(state: Optional[str] = None, repository: Optional[str] = None, *, limit: Optional[int] = None,
             **connection: Any) -> List[TaskInfo]:
        """The workspace's runs, newest first (every page, or the first ``limit``), of one
        ``state`` or ``repository`` if given."""
        t = connect(**connection)
        try:
            return [TaskInfo.from_dict(d) for d in list_pages(t, "/tasks", {"state": state, "repository": repository}, limit)]
        finally:
            t.close()

    @staticmethod
    def get(task: TaskRef, **connection: Any) -> TaskInfo:
        t = connect(**connection)
        try:
            return TaskInfo.from_dict(t.data("GET", "/tasks/" + seg(task_id(task))))
        finally:
            t.close()

    @staticmethod
    def cancel(task: TaskRef, **connection: Any) -> TaskInfo:
        """Stop a run (idempotent; a run that has ended is answered unchanged). A running
        run's work is still pushed: follow :meth:`events` for its end."""
        t = connect(**connection)
        try:
            return TaskInfo.from_dict(t.data("POST", f"/tasks/{seg(task_id(task))}/cancel"))
        finally:
            t.close()

    @staticmethod
    def events(task: TaskRef, *, timeout: Optional[float] = None, **connection: Any) -> Iterator[TaskEvent]:
        """The run's events as they come (``GET /api/v1/tasks/{id}/events``): its current
        state first, then every change and progress count, ending after a terminal state.
        ``timeout`` bounds the wait for each event (:class:`~cella.CellaTimeoutError`)."""
        t = connect(**connection)
        try:
            with t.stream("GET", f"/tasks/{seg(task_id(task))}/events", timeout=_stream_timeout(timeout)) as resp:
                from .sandbox import _sse_events

                rid = resp.headers.get("x-request-id")
                for ev in _sse_events(resp):
                    if isinstance(ev, SSEEvent):
                        out = _event(ev, rid)
                        if out is not None:
                            yield out
                            if out.finished:
                                return
        finally:
            t.close()

    follow = events

    @staticmethod
    def log(task: TaskRef, *, timeout: Optional[float] = None, **connection: Any) -> Iterator[TaskLogChunk]:
        """The agent's output while the run is alive (``GET /api/v1/tasks/{id}/log``), a
        chunk at a time, until the run ends. Never stored: once the run has ended this raises
        :class:`~cella.GoneError`."""
        t = connect(**connection)
        try:
            with t.stream("GET", f"/tasks/{seg(task_id(task))}/log", timeout=_stream_timeout(timeout)) as resp:
                from .sandbox import _sse_events

                rid = resp.headers.get("x-request-id")
                for ev in _sse_events(resp):
                    if isinstance(ev, SSEEvent):
                        chunk = _log_chunk(ev, rid)
                        if chunk is not None:
                            yield chunk
        finally:
            t.close()

    @staticmethod
    def wait(task: TaskRef, *, timeout: Optional[float] = 3600.0, on_event: EventCallback = None,
             **connection: Any) -> TaskInfo:
        """Follow the run's events until it has ended (``on_event`` gets each), then answer
        it as it ended. :class:`~cella.CellaTimeoutError` after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = None if deadline is None else max(deadline - time.monotonic(), 0.001)
            try:
                for ev in Task.events(task, timeout=remaining, **connection):
                    if on_event is not None:
                        on_event(ev)
                    if deadline is not None and time.monotonic() >= deadline and not ev.finished:
                        break
            except CellaTimeoutError:
                pass
            info = Task.get(task, **connection)
            if info.finished:
                return info
            if deadline is not None and time.monotonic() >= deadline:
                raise CellaTimeoutError(f"task {info.id} had not ended after {timeout} s (state {info.state})")
            time.sleep(0.5)  # the stream broke off before the end: follow it again


class AsyncTask:
    """The workspace's task runs on asyncio; see :class:`Task`."""

    @staticmethod
    async def start(repository: str, task: str, *, base_branch: Optional[str] = None, forge: Optional[str] = None,
                    agent: Optional[str] = None, metadata: Optional[Mapping[str, str]] = None, **connection: Any) -> TaskInfo:
        t = aconnect(**connection)
        try:
            return TaskInfo.from_dict(await t.data("POST", "/tasks", json=start_body(repository, task, base_branch, forge, agent, metadata)))
        finally:
            await t.aclose()

    @staticmethod
    async def list(state: Optional[str] = None, repository: Optional[str] = None, *, limit: Optional[int] = None,
                   **connection: Any) -> List[TaskInfo]:
        t = aconnect(**connection)
        try:
            return [TaskInfo.from_dict(d) for d in await alist_pages(t, "/tasks", {"state": state, "repository": repository}, limit)]
        finally:
            await t.aclose()

    @staticmethod
    async def get(task: TaskRef, **connection: Any) -> TaskInfo:
        t = aconnect(**connection)
        try:
            return TaskInfo.from_dict(await t.data("GET", "/tasks/" + seg(task_id(task))))
        finally:
            await t.aclose()

    @staticmethod
    async def cancel(task: TaskRef, **connection: Any) -> TaskInfo:
        t = aconnect(**connection)
        try:
            return TaskInfo.from_dict(await t.data("POST", f"/tasks/{seg(task_id(task))}/cancel"))
        finally:
            await t.aclose()

    @staticmethod
    async def events(task: TaskRef, *, timeout: Optional[float] = None, **connection: Any) -> AsyncIterator[TaskEvent]:
        t = aconnect(**connection)
        try:
            async with t.stream("GET", f"/tasks/{seg(task_id(task))}/events", timeout=_stream_timeout(timeout)) as resp:
                from .async_sandbox import _sse_events

                rid = resp.headers.get("x-request-id")
                async for ev in _sse_events(resp):
                    if isinstance(ev, SSEEvent):
                        out = _event(ev, rid)
                        if out is not None:
                            yield out
                            if out.finished:
                                return
        finally:
            await t.aclose()

    follow = events

    @staticmethod
    async def log(task: TaskRef, *, timeout: Optional[float] = None, **connection: Any) -> AsyncIterator[TaskLogChunk]:
        t = aconnect(**connection)
        try:
            async with t.stream("GET", f"/tasks/{seg(task_id(task))}/log", timeout=_stream_timeout(timeout)) as resp:
                from .async_sandbox import _sse_events

                rid = resp.headers.get("x-request-id")
                async for ev in _sse_events(resp):
                    if isinstance(ev, SSEEvent):
                        chunk = _log_chunk(ev, rid)
                        if chunk is not None:
                            yield chunk
        finally:
            await t.aclose()

    @staticmethod
    async def wait(task: TaskRef, *, timeout: Optional[float] = 3600.0, on_event: EventCallback = None,
                   **connection: Any) -> TaskInfo:
        import inspect

        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = None if deadline is None else max(deadline - time.monotonic(), 0.001)
            try:
                async for ev in AsyncTask.events(task, timeout=remaining, **connection):
                    if on_event is not None:
                        r = on_event(ev)
                        if inspect.isawaitable(r):
                            await r
                    if deadline is not None and time.monotonic() >= deadline and not ev.finished:
                        break
            except CellaTimeoutError:
                pass
            info = await AsyncTask.get(task, **connection)
            if info.finished:
                return info
            if deadline is not None and time.monotonic() >= deadline:
                raise CellaTimeoutError(f"task {info.id} had not ended after {timeout} s (state {info.state})")
            await asyncio.sleep(0.5)
