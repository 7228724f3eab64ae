"""Request bodies and answer handling shared by the blocking and the asyncio clients."""

from __future__ import annotations

import base64
import json
import math
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Union
from urllib.parse import quote

from ._sse import SSEEvent, output_bytes
from .errors import CellaError, error_from_envelope
from .models import CommandResult, NetworkArg, NetworkPolicy, OutputChunk

Command = Union[str, Sequence[str]]

# Extra seconds the HTTP client waits beyond a command's own timeout before giving up.
TIMEOUT_MARGIN = 30.0
SERVER_DEFAULT_EXEC_TIMEOUT = 3600
CODE_TIMEOUT_CAP = 300.0


def seg(value: Any) -> str:
    """One path segment, escaped."""
    return quote(str(value), safe="")


def sandbox_path(sandbox_id: str, *rest: str) -> str:
    return "/sandboxes/" + seg(sandbox_id) + "".join("/" + r for r in rest)


def snapshot_body(memory: Optional[bool]) -> Dict[str, Any]:
    """The request arguments of ``POST .../snapshots``: no body unless ``memory`` is given."""
    return {} if memory is None else {"json": {"memory": memory}}


def whole_seconds(value: Optional[float], name: str) -> Optional[int]:
    """A timeout in seconds as the whole number the server takes (rounded up)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise TypeError(f"{name} must be a number of seconds")
    return int(math.ceil(value))


def network_body(network: NetworkArg) -> Optional[Dict[str, Any]]:
    if network is None:
        return None
    if isinstance(network, NetworkPolicy):
        return network.to_dict()
    return dict(network)


def create_body(
    *,
    template: Optional[str],
    size: Optional[str],
    timeout: Optional[float],
    metadata: Optional[Mapping[str, str]],
    env: Optional[Mapping[str, str]],
    network: NetworkArg,
    idle_timeout: Optional[float],
    persistent: Optional[bool],
    always_on: Optional[bool],
    wait: bool,
    extra: Optional[Mapping[str, Any]],
    snapshot_id: Optional[str] = None,
    runtime: Optional[str] = None,
) -> Dict[str, Any]:
    body: Dict[str, Any] = {}
    if snapshot_id is not None:
        body["snapshot_id"] = snapshot_id
    if runtime is not None:
        body["runtime"] = runtime
    if template is not None:
        body["template_id"] = template
    if size is not None:
        body["size"] = size
    if timeout is not None:
        body["timeout_sec"] = whole_seconds(timeout, "timeout")
    if idle_timeout is not None:
        body["idle_timeout_sec"] = whole_seconds(idle_timeout, "idle_timeout")
    if persistent is not None:
        body["persistent"] = bool(persistent)
    if always_on is not None:
        body["always_on"] = bool(always_on)
    if metadata is not None:
        body["metadata"] = dict(metadata)
    if env is not None:
        body["env"] = dict(env)
    net = network_body(network)
    if net is not None:
        body["network"] = net
    if not wait:
        body["wait"] = False
    if extra:
        body.update(extra)
    return body


def command_body(
    cmd: Command,
    *,
    env: Optional[Mapping[str, str]] = None,
    cwd: Optional[str] = None,
    user: Optional[str] = None,
    timeout: Optional[float] = None,
    stdin: Union[str, bytes, None] = None,
    tag: Optional[str] = None,
) -> Dict[str, Any]:
    """The body of an exec (a shell line as ``command``, a list as ``argv``)."""
    body: Dict[str, Any] = {}
    if isinstance(cmd, str):
        body["command"] = cmd
    elif isinstance(cmd, (list, tuple)):
        body["argv"] = [str(a) for a in cmd]
    else:
        raise TypeError("cmd must be a shell line (str) or a list of arguments")
    if env is not None:
        body["env"] = dict(env)
    if cwd is not None:
        body["cwd"] = cwd
    if user is not None:
        body["user"] = user
    if timeout is not None:
        body["timeout_sec"] = whole_seconds(timeout, "timeout")
    if stdin is not None:
        body["stdin"] = stdin.decode("utf-8") if isinstance(stdin, bytes) else stdin
    if tag is not None:
        body["tag"] = tag
    return body


RunFiles = Union[Mapping[str, Union[str, bytes]], Sequence[Any], None]


def run_files(files: RunFiles) -> List[Dict[str, Any]]:
    """The ``files`` of a one-shot run: a mapping of path to content (text, or bytes sent as
    base64), or a list of ``{"path", "content", "encoding"}`` objects or (path, content)
    pairs."""
    if files is None:
        return []
    items = files.items() if isinstance(files, Mapping) else files
    out: List[Dict[str, Any]] = []
    for item in items:
        if isinstance(item, Mapping):
            out.append(dict(item))
            continue
        path, content = item
        if isinstance(content, (bytes, bytearray)):
            out.append({"path": str(path), "content": base64.b64encode(bytes(content)).decode("ascii"), "encoding": "base64"})
        else:
            out.append({"path": str(path), "content": str(content)})
    return out


def run_body(
    cmd: Optional[Command],
    *,
    files: RunFiles,
    artifacts: Optional[Sequence[str]],
    template: Optional[str],
    size: Optional[str],
    env: Optional[Mapping[str, str]],
    metadata: Optional[Mapping[str, str]],
    network: NetworkArg,
    cwd: Optional[str],
    user: Optional[str],
    timeout: Optional[float],
    stdin: Union[str, bytes, None],
    runtime: Optional[str] = None,
) -> Dict[str, Any]:
    """The body of a one-shot run. ``cmd=None`` sends no command (the server answers 400)."""
    body = command_body(cmd, env=env, cwd=cwd, user=user, timeout=timeout, stdin=stdin) if cmd is not None else {}
    if template is not None:
        body["template_id"] = template
    if runtime is not None:
        body["runtime"] = runtime
    if size is not None:
        body["size"] = size
    if metadata is not None:
        body["metadata"] = dict(metadata)
    if cmd is None and env is not None:
        body["env"] = dict(env)
    net = network_body(network)
    if net is not None:
        body["network"] = net
    if files:
        body["files"] = run_files(files)
    if artifacts:
        body["artifacts"] = [str(a) for a in artifacts]
    return body


def run_http_timeout(timeout: Optional[float]) -> float:
    """A one-shot run creates and destroys a sandbox around its command."""
    return exec_http_timeout(timeout) + 120.0


def next_log_offset(data: Mapping[str, Any]) -> int:
    """Where the next poll of a build's log starts: its ``log_offset`` and the byte length of
    ``log`` in UTF-8."""
    return int(data.get("log_offset") or 0) + len((data.get("log") or "").encode("utf-8"))


def exec_http_timeout(timeout: Optional[float]) -> float:
    """How long the HTTP call of an exec may take: the command's timeout and a margin."""
    return float(whole_seconds(timeout, "timeout") or SERVER_DEFAULT_EXEC_TIMEOUT) + TIMEOUT_MARGIN


def code_body(code: str, language: Optional[str], context: Optional[str], timeout: Optional[float]) -> Dict[str, Any]:
    body: Dict[str, Any] = {"code": code}
    if language is not None:
        body["language"] = language
    if context is not None:
        body["context"] = context
    if timeout is not None:
        body["timeout"] = float(timeout)
    return body


def code_http_timeout(timeout: Optional[float]) -> float:
    t = CODE_TIMEOUT_CAP if timeout is None else min(float(timeout), CODE_TIMEOUT_CAP)
    # A cell past its timeout is interrupted, and a kernel that does not stop is restarted.
    return t + TIMEOUT_MARGIN + 30.0


def file_mode(mode: Union[int, str, None]) -> Optional[str]:
    if mode is None:
        return None
    if isinstance(mode, int):
        return format(mode, "04o")
    return str(mode)


def signal_value(sig: Union[str, int, Any]) -> Union[str, int]:
    """A signal as the server takes it: a name (``"TERM"``), a number, or a ``signal.Signals``."""
    name = getattr(sig, "name", None)
    if isinstance(name, str):
        return name
    if isinstance(sig, (str, int)):
        return sig
    raise TypeError("signal must be a name, a number or a signal.Signals")


Callback = Optional[Callable[[str], Any]]


class OutputCollector:
    """Folds the events of a streamed exec or of a process's output into a result, calling
    the callbacks with each piece of text as it comes."""

    def __init__(self, request_id: Optional[str] = None) -> None:
        self.stdout = bytearray()
        self.stderr = bytearray()
        self.exit: Optional[Dict[str, Any]] = None
        self.request_id = request_id

    def chunk(self, ev: SSEEvent) -> Optional[OutputChunk]:
        """The output piece an event carries; raises for an ``error`` event; records
        ``exit``."""
        if ev.event in ("stdout", "stderr"):
            data = output_bytes(ev.json())
            (self.stdout if ev.event == "stdout" else self.stderr).extend(data)
            return OutputChunk(ev.event, data)
        if ev.event == "exit":
            self.exit = ev.json() or {}
            return None
        if ev.event == "error":
            raise stream_error(ev, self.request_id)
        return None

    def result(self) -> CommandResult:
        ex = self.exit or {}
        return CommandResult(
            exit_code=int(ex.get("exit_code", -1)),
            stdout=self.stdout.decode("utf-8", "replace"),
            stderr=self.stderr.decode("utf-8", "replace"),
            duration_ms=int(ex.get("duration_ms") or 0),
            timed_out=bool(ex.get("timed_out", False)),
        )


def stream_error(ev: SSEEvent, request_id: Optional[str]) -> CellaError:
    """The exception for an ``error`` event (the error envelope as its data)."""
    try:
        payload = json.loads(ev.data)
    except ValueError:
        return CellaError(ev.data or "the stream ended with an error", request_id=request_id, status=200)
    err = error_from_envelope(payload, status=None, request_id=request_id)
    return err
