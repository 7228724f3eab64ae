"""Typed views of what the server answers. Each keeps the raw JSON object in ``raw``, so a
field this SDK does not know yet is still at hand."""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from decimal import Decimal, InvalidOperation
from typing import Any, Dict, Iterable, List, Mapping, Optional, Union

_TIME = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?(Z|z|[+-]\d{2}:?\d{2})?$"
)


def parse_time(value: Any) -> Optional[datetime]:
    """An RFC 3339 time as an aware ``datetime`` (None stays None)."""
    if value is None or isinstance(value, datetime):
        return value
    m = _TIME.match(str(value).strip())
    if not m:
        raise ValueError(f"not an RFC 3339 time: {value!r}")
    year, month, day, hour, minute, second = (int(g) for g in m.groups()[:6])
    frac = m.group(7) or ""
    micro = int((frac + "000000")[:6]) if frac else 0
    tz = m.group(8)
    if tz is None or tz in ("Z", "z"):
        tzinfo = timezone.utc
    else:
        sign = 1 if tz[0] == "+" else -1
        digits = tz[1:].replace(":", "")
        tzinfo = timezone(sign * timedelta(hours=int(digits[:2]), minutes=int(digits[2:])))
    return datetime(year, month, day, hour, minute, second, micro, tzinfo=tzinfo)


def parse_money(value: Any) -> Decimal:
    """An amount as the server sends it (a decimal string such as ``"12.500000"``) as an exact
    ``Decimal``; None or absent is 0. Never goes through a float."""
    if value is None:
        return Decimal("0")
    if isinstance(value, Decimal):
        return value
    if not isinstance(value, str):
        raise ValueError(f"not a decimal amount: {value!r}")
    try:
        return Decimal(value)
    except InvalidOperation:
        raise ValueError(f"not a decimal amount: {value!r}") from None


def _str_map(value: Any) -> Dict[str, str]:
    return {str(k): str(v) for k, v in (value or {}).items()}


# --------------------------------------------------------------------------- sandboxes


@dataclass
class NetworkPolicy:
    """A sandbox's egress policy: ``egress`` is ``"allow"`` (public internet open) or
    ``"deny"`` (only ``allow`` open); ``deny`` wins over ``allow``."""

    egress: str = "allow"
    allow: List[str] = field(default_factory=list)
    deny: List[str] = field(default_factory=list)

    @classmethod
    def from_dict(cls, d: Optional[Mapping[str, Any]]) -> "NetworkPolicy":
        d = d or {}
        return cls(egress=d.get("egress", "allow"), allow=list(d.get("allow") or []), deny=list(d.get("deny") or []))

    def to_dict(self) -> Dict[str, Any]:
        return {"egress": self.egress, "allow": list(self.allow), "deny": list(self.deny)}


@dataclass
class SandboxInfo:
    """A sandbox as the server describes it (``GET /api/v1/sandboxes/{id}``)."""

    id: str
    state: str
    template_id: str
    size: str
    cpu_count: int
    memory_mb: int
    disk_size_mb: int
    ready: bool
    timeout_sec: int
    timeout_remaining_ms: Optional[int]
    always_on: bool
    persistent: bool
    idle_timeout_sec: int
    metadata: Dict[str, str]
    created_at: Optional[datetime]
    started_at: Optional[datetime]
    ready_at: Optional[datetime]
    destroyed_at: Optional[datetime]
    total_runtime_sec: Optional[int]
    tenant_id: Optional[str] = None
    owner_id: Optional[str] = None
    preview_url: Optional[str] = None
    state_reason: Optional[str] = None
    network: Optional[NetworkPolicy] = None
    resource_contract: Dict[str, Any] = field(default_factory=dict)
    #: Compute price per running second, the workspace's rate when the sandbox was created.
    compute_rate: Decimal = Decimal("0")
    #: Compute charged so far (at least 60 s x rate once it started); final once destroyed.
    compute_cost: Decimal = Decimal("0")
    #: What its model gateway requests cost.
    model_cost: Decimal = Decimal("0")
    #: The isolation runtime it runs on: ``namespace`` or ``gvisor``.
    runtime: str = ""
    #: Where a paused sandbox's memory is (``in_ram`` or ``on_disk``); None when the server does not say.
    memory: Optional[str] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "SandboxInfo":
        return cls(
            id=d["id"],
            state=d.get("state", ""),
            template_id=d.get("template_id", ""),
            size=d.get("size", ""),
            cpu_count=int(d.get("cpu_count") or 0),
            memory_mb=int(d.get("memory_mb") or 0),
            disk_size_mb=int(d.get("disk_size_mb") or 0),
            ready=bool(d.get("ready", False)),
            timeout_sec=int(d.get("timeout_sec") or 0),
            timeout_remaining_ms=d.get("timeout_remaining_ms"),
            always_on=bool(d.get("always_on", False)),
            persistent=bool(d.get("persistent", True)),
            idle_timeout_sec=int(d.get("idle_timeout_sec") or 0),
            metadata=_str_map(d.get("metadata")),
            created_at=parse_time(d.get("created_at")),
            started_at=parse_time(d.get("started_at")),
            ready_at=parse_time(d.get("ready_at")),
            destroyed_at=parse_time(d.get("destroyed_at")),
            total_runtime_sec=d.get("total_runtime_sec"),
            tenant_id=d.get("tenant_id"),
            owner_id=d.get("owner_id"),
            preview_url=d.get("preview_url"),
            state_reason=d.get("state_reason"),
            network=NetworkPolicy.from_dict(d["network"]) if isinstance(d.get("network"), Mapping) else None,
            resource_contract=dict(d.get("resource_contract") or {}),
            compute_rate=parse_money(d.get("compute_rate")),
            compute_cost=parse_money(d.get("compute_cost")),
            model_cost=parse_money(d.get("model_cost")),
            runtime=d.get("runtime") or "",
            memory=d.get("memory"),
            raw=dict(d),
        )

    @property
    def is_running(self) -> bool:
        return self.state == "running"


@dataclass
class SandboxUsage:
    """What a sandbox used (``GET .../usage``)."""

    sandbox_id: str
    state: str
    running_sec: float
    paused_sec: float
    billed_sec: int
    cpu_sec: float
    memory_mib_sec: float
    memory_mib_now: Optional[float]
    measured_at: Optional[datetime]
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "SandboxUsage":
        return cls(
            sandbox_id=d.get("sandbox_id", ""),
            state=d.get("state", ""),
            running_sec=float(d.get("running_sec") or 0.0),
            paused_sec=float(d.get("paused_sec") or 0.0),
            billed_sec=int(d.get("billed_sec") or 0),
            cpu_sec=float(d.get("cpu_sec") or 0.0),
            memory_mib_sec=float(d.get("memory_mib_sec") or 0.0),
            memory_mib_now=None if d.get("memory_mib_now") is None else float(d["memory_mib_now"]),
            measured_at=parse_time(d.get("measured_at")),
            raw=dict(d),
        )


@dataclass
class ExposedPort:
    """Where a port inside a sandbox is reachable through the server's preview proxy:
    ``url`` (the one to use: the path form while the server's preview domain is ``localhost``,
    which every HTTP client opens, else the host-name form), ``host_url`` (host-name form, the
    sandbox's own origin, the only one browsers are served) and ``path_url`` (path form, for
    programs), signed with ``token`` (valid until ``token_expires_at``) when the sandbox's
    preview is private."""

    port: int
    url: str
    path_url: Optional[str] = None
    token: Optional[str] = None
    host_url: Optional[str] = None
    token_expires_at: Optional[datetime] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ExposedPort":
        return cls(port=int(d.get("port") or 0), url=d.get("url") or "", path_url=d.get("path_url"),
                   token=d.get("token"), host_url=d.get("host_url"),
                   token_expires_at=parse_time(d.get("token_expires_at")), raw=dict(d))


# --------------------------------------------------------------------------- commands


@dataclass
class CommandResult:
    """A finished command: exit code (128 + N when signal N killed it) and its output."""

    exit_code: int
    stdout: str = ""
    stderr: str = ""
    duration_ms: int = 0
    timed_out: bool = False
    stdout_truncated: bool = False
    stderr_truncated: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "CommandResult":
        return cls(
            exit_code=int(d.get("exit_code", -1)),
            stdout=d.get("stdout") or "",
            stderr=d.get("stderr") or "",
            duration_ms=int(d.get("duration_ms") or 0),
            timed_out=bool(d.get("timed_out", False)),
            stdout_truncated=bool(d.get("stdout_truncated", False)),
            stderr_truncated=bool(d.get("stderr_truncated", False)),
        )


@dataclass
class ProcessInfo:
    """A background process (``GET .../processes/{pid}``)."""

    pid: int
    argv: List[str]
    state: str
    user: str = "user"
    cwd: str = ""
    tag: Optional[str] = None
    exit_code: Optional[int] = None
    started_at: Optional[datetime] = None
    ended_at: Optional[datetime] = None
    output_dropped_bytes: int = 0
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def is_running(self) -> bool:
        return self.state == "running"

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ProcessInfo":
        return cls(
            pid=int(d["pid"]),
            argv=list(d.get("argv") or []),
            state=d.get("state", ""),
            user=d.get("user", "user"),
            cwd=d.get("cwd", ""),
            tag=d.get("tag"),
            exit_code=d.get("exit_code"),
            started_at=parse_time(d.get("started_at")),
            ended_at=parse_time(d.get("ended_at")),
            output_dropped_bytes=int(d.get("output_dropped_bytes") or 0),
            raw=dict(d),
        )


@dataclass
class OutputChunk:
    """A piece of a command's output: ``stream`` is ``"stdout"`` or ``"stderr"``."""

    stream: str
    data: bytes

    @property
    def text(self) -> str:
        return self.data.decode("utf-8", "replace")


# --------------------------------------------------------------------------- files


@dataclass
class EntryInfo:
    """A file, directory or link inside a sandbox."""

    name: str
    path: str
    type: str
    size: int
    mode: str
    modified_at: Optional[datetime]
    uid: Optional[int] = None
    gid: Optional[int] = None
    symlink_target: Optional[str] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def is_dir(self) -> bool:
        return self.type == "dir"

    @property
    def is_file(self) -> bool:
        return self.type == "file"

    @property
    def is_symlink(self) -> bool:
        return self.type == "symlink"

    @property
    def permissions(self) -> int:
        """``mode`` as an integer (``"0644"`` -> ``0o644``)."""
        return int(self.mode, 8) if self.mode else 0

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "EntryInfo":
        return cls(
            name=d.get("name", ""),
            path=d.get("path", ""),
            type=d.get("type", ""),
            size=int(d.get("size") or 0),
            mode=str(d.get("mode") or ""),
            modified_at=parse_time(d.get("modified_at")),
            uid=d.get("uid"),
            gid=d.get("gid"),
            symlink_target=d.get("symlink_target"),
            raw=dict(d),
        )


class EntryList(List[EntryInfo]):
    """A directory listing; ``truncated`` is true when the server had more entries than
    ``limit``."""

    def __init__(self, entries: Iterable[EntryInfo] = (), truncated: bool = False) -> None:
        super().__init__(entries)
        self.truncated = truncated


@dataclass
class FilesystemEvent:
    """One change seen by a watch: ``type`` is ``create``, ``modify``, ``delete`` or
    ``rename`` (then ``from_path`` is where the entry was)."""

    type: str
    path: str
    is_dir: bool = False
    from_path: Optional[str] = None

    @classmethod
    def from_sse(cls, event: str, d: Mapping[str, Any]) -> "FilesystemEvent":
        return cls(type=event, path=d.get("path", ""), is_dir=bool(d.get("dir", False)), from_path=d.get("from"))


# --------------------------------------------------------------------------- code interpreter

_TEXT_MIMES = ("text/", "application/json", "application/javascript", "image/svg+xml")


@dataclass
class Output:
    """A rich output of a cell. ``data`` is text for text formats (HTML, JSON, SVG,
    markdown) and base64 for binary ones (PNG, JPEG)."""

    mime: str
    data: str

    @property
    def is_binary(self) -> bool:
        return not self.mime.startswith(_TEXT_MIMES)

    @property
    def bytes(self) -> bytes:
        """The output's bytes: base64 decoded for binary formats, UTF-8 for text ones."""
        if self.is_binary:
            return base64.b64decode(self.data)
        return self.data.encode("utf-8")

    @property
    def text(self) -> Optional[str]:
        return None if self.is_binary else self.data


@dataclass
class ExecutionError:
    """What a cell raised: the exception's ``name`` and ``value`` and its ``traceback``."""

    name: str
    value: str
    traceback: str = ""

    def __str__(self) -> str:
        return f"{self.name}: {self.value}"


@dataclass
class Execution:
    """The result of one cell of the code interpreter."""

    ok: bool
    stdout: str = ""
    stderr: str = ""
    result: Optional[str] = None
    language: str = "python"
    error: Optional[ExecutionError] = None
    outputs: List[Output] = field(default_factory=list)
    restarted: bool = False

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Execution":
        err = d.get("error")
        return cls(
            ok=bool(d.get("ok", False)),
            stdout=d.get("stdout") or "",
            stderr=d.get("stderr") or "",
            result=d.get("result"),
            language=d.get("language") or "python",
            error=ExecutionError(err.get("name", ""), err.get("value", ""), err.get("traceback", "")) if err else None,
            outputs=[Output(o.get("mime", ""), o.get("data", "")) for o in d.get("outputs") or []],
            restarted=bool(d.get("restarted", False)),
        )

    @property
    def text(self) -> Optional[str]:
        """The value of the cell's last expression, as the REPL shows it."""
        return self.result

    def output(self, mime: str) -> Optional[Output]:
        """The first output of that MIME type."""
        for out in self.outputs:
            if out.mime == mime:
                return out
        return None

    def _bytes(self, mime: str) -> Optional["bytes"]:
        out = self.output(mime)
        return out.bytes if out else None

    def _text(self, mime: str) -> Optional[str]:
        out = self.output(mime)
        return out.data if out else None

    @property
    def png(self) -> Optional["bytes"]:
        return self._bytes("image/png")

    @property
    def jpeg(self) -> Optional["bytes"]:
        return self._bytes("image/jpeg")

    @property
    def svg(self) -> Optional[str]:
        return self._text("image/svg+xml")

    @property
    def html(self) -> Optional[str]:
        return self._text("text/html")

    @property
    def markdown(self) -> Optional[str]:
        return self._text("text/markdown")

    @property
    def json(self) -> Any:
        """The first ``application/json`` output, parsed (None when there is none)."""
        data = self._text("application/json")
        return None if data is None else json.loads(data)

    @property
    def images(self) -> List[Output]:
        return [o for o in self.outputs if o.mime.startswith("image/")]

    def raise_error(self) -> None:
        """Raise :class:`ExecutionFailed` if the cell raised."""
        if self.error is not None:
            raise ExecutionFailed(self)


class ExecutionFailed(Exception):
    """Raised by :meth:`Execution.raise_error` for a cell that raised."""

    def __init__(self, execution: Execution) -> None:
        assert execution.error is not None
        super().__init__(f"{execution.error.name}: {execution.error.value}\n{execution.error.traceback}")
        self.execution = execution


@dataclass
class CodeContext:
    """A named namespace of the interpreter of one language."""

    name: str
    language: str


@dataclass
class KernelInfo:
    """One language's interpreter in a sandbox."""

    language: str
    running: bool
    busy: bool
    contexts: List[str] = field(default_factory=list)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "KernelInfo":
        return cls(
            language=d.get("language", ""),
            running=bool(d.get("running", False)),
            busy=bool(d.get("busy", False)),
            contexts=list(d.get("contexts") or []),
        )


NetworkArg = Union[NetworkPolicy, Mapping[str, Any], None]


# --------------------------------------------------------------------------- snapshots


@dataclass
class SnapshotInfo:
    """A snapshot of a sandbox's files, and with ``memory`` its running state too
    (``GET /api/v1/snapshots/{id}``)."""

    id: str
    sandbox_id: str
    template_id: str
    size: str
    created_at: Optional[datetime]
    size_bytes: int
    #: Whether it holds the sandbox's memory and processes too (a ``gvisor`` checkpoint):
    #: sandboxes made from it continue where the sandbox was.
    memory: bool = False
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "SnapshotInfo":
        return cls(
            id=d["id"],
            sandbox_id=d.get("sandbox_id", ""),
            template_id=d.get("template_id", ""),
            size=d.get("size", ""),
            created_at=parse_time(d.get("created_at")),
            size_bytes=int(d.get("size_bytes") or 0),
            memory=bool(d.get("memory", False)),
            raw=dict(d),
        )


# --------------------------------------------------------------------------- one-shot runs


@dataclass
class ArtifactInfo:
    """A file kept from a sandbox (by a one-shot run, or ``collect_artifacts``), until
    ``expires_at``; download it with :meth:`cella.Artifact.download`."""

    id: str
    sandbox_id: str
    path: str
    size: int
    url: str
    created_at: Optional[datetime]
    expires_at: Optional[datetime]
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ArtifactInfo":
        return cls(
            id=d["id"],
            sandbox_id=d.get("sandbox_id", ""),
            path=d.get("path", ""),
            size=int(d.get("size") or 0),
            url=d.get("url") or "",
            created_at=parse_time(d.get("created_at")),
            expires_at=parse_time(d.get("expires_at")),
            raw=dict(d),
        )


@dataclass
class RunResult:
    """A one-shot run (``POST /api/v1/sandboxes/run``): the command's result, the sandbox it
    ran in (destroyed by now) and the artifacts kept."""

    exit_code: int
    stdout: str
    stderr: str
    duration_ms: int
    timed_out: bool
    sandbox_id: str
    artifacts: List[ArtifactInfo] = field(default_factory=list)
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "RunResult":
        return cls(
            exit_code=int(d.get("exit_code", -1)),
            stdout=d.get("stdout") or "",
            stderr=d.get("stderr") or "",
            duration_ms=int(d.get("duration_ms") or 0),
            timed_out=bool(d.get("timed_out", False)),
            sandbox_id=d.get("sandbox_id", ""),
            artifacts=[ArtifactInfo.from_dict(a) for a in d.get("artifacts") or []],
            raw=dict(d),
        )

    def command_result(self) -> CommandResult:
        return CommandResult(self.exit_code, self.stdout, self.stderr, self.duration_ms, self.timed_out)


# --------------------------------------------------------------------------- custom templates


@dataclass
class TemplateInfo:
    """A template of the catalog (``GET /api/v1/templates/{id}``)."""

    id: str
    name: str
    default_size: str
    readiness: str
    sizes: List[Dict[str, Any]] = field(default_factory=list)
    #: The runtimes its sandboxes can run on on this server, its default first.
    runtimes: List[str] = field(default_factory=list)
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "TemplateInfo":
        return cls(
            id=d["id"],
            name=d.get("name") or d["id"],
            default_size=d.get("default_size", ""),
            readiness=d.get("readiness", ""),
            sizes=[dict(s) for s in d.get("sizes") or []],
            runtimes=[str(r) for r in d.get("runtimes") or []],
            raw=dict(d),
        )


@dataclass
class BuildStep:
    """One step of a template build: ``state`` is pending, running, done, cached or failed."""

    index: int
    kind: str
    state: str
    duration_ms: Optional[int] = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "BuildStep":
        return cls(index=int(d.get("index") or 0), kind=d.get("kind", ""), state=d.get("state", ""),
                   duration_ms=d.get("duration_ms"))


@dataclass
class TemplateBuild:
    """A build of a custom template. ``log`` is the log from byte ``log_offset`` on."""

    id: str
    template_id: str
    state: str
    steps: List[BuildStep]
    log: str
    log_offset: int
    error: Optional[str]
    created_at: Optional[datetime]
    finished_at: Optional[datetime]
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def finished(self) -> bool:
        return self.state in ("ready", "failed")

    @property
    def ok(self) -> bool:
        return self.state == "ready"

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "TemplateBuild":
        return cls(
            id=d["id"],
            template_id=d.get("template_id", ""),
            state=d.get("state", ""),
            steps=[BuildStep.from_dict(s) for s in d.get("steps") or []],
            log=d.get("log") or "",
            log_offset=int(d.get("log_offset") or 0),
            error=d.get("error"),
            created_at=parse_time(d.get("created_at")),
            finished_at=parse_time(d.get("finished_at")),
            raw=dict(d),
        )


# --------------------------------------------------------------------------- task runs

TASK_TERMINAL_STATES = frozenset({"stopped", "failed", "cancelled"})


@dataclass
class PullRequest:
    """The draft pull (or merge) request a task run opened."""

    number: int
    url: str
    draft: bool

    @classmethod
    def from_dict(cls, d: Optional[Mapping[str, Any]]) -> Optional["PullRequest"]:
        if not d:
            return None
        return cls(number=int(d.get("number") or 0), url=str(d.get("url") or ""), draft=bool(d.get("draft", True)))


@dataclass
class TaskInfo:
    """A task run (``GET /api/v1/tasks/{id}``): an agent working on a repository's branch in
    a sandbox of its own. Amounts are exact ``Decimal`` values."""

    id: str
    workspace_id: str
    repository: str
    base_branch: str
    branch: str
    forge: str
    agent: str
    state: str
    failure_reason: Optional[str]
    stop_reason: Optional[str]
    pull_request: Optional[PullRequest]
    created_by: Optional[str]
    queued_at: Optional[datetime]
    started_at: Optional[datetime]
    ended_at: Optional[datetime]
    compute_sec: int
    compute_rate: Decimal
    compute_cost: Decimal
    model_cost: Decimal
    model_requests: int
    session_limit_min: int
    metadata: Dict[str, str]
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def finished(self) -> bool:
        """True once the run is ``stopped``, ``failed`` or ``cancelled``."""
        return self.state in TASK_TERMINAL_STATES

    @property
    def ok(self) -> bool:
        return self.state == "stopped"

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "TaskInfo":
        return cls(
            id=d["id"],
            workspace_id=d.get("workspace_id", ""),
            repository=d.get("repository", ""),
            base_branch=d.get("base_branch", ""),
            branch=d.get("branch", ""),
            forge=d.get("forge", ""),
            agent=d.get("agent", ""),
            state=d.get("state", ""),
            failure_reason=d.get("failure_reason"),
            stop_reason=d.get("stop_reason"),
            pull_request=PullRequest.from_dict(d.get("pull_request")),
            created_by=d.get("created_by"),
            queued_at=parse_time(d.get("queued_at")),
            started_at=parse_time(d.get("started_at")),
            ended_at=parse_time(d.get("ended_at")),
            compute_sec=int(d.get("compute_sec") or 0),
            compute_rate=parse_money(d.get("compute_rate")),
            compute_cost=parse_money(d.get("compute_cost")),
            model_cost=parse_money(d.get("model_cost")),
            model_requests=int(d.get("model_requests") or 0),
            session_limit_min=int(d.get("session_limit_min") or 0),
            metadata=_str_map(d.get("metadata")),
            raw=dict(d),
        )


@dataclass
class TaskEvent:
    """One event of ``GET /api/v1/tasks/{id}/events``: ``event`` is ``"state"`` (``state``,
    ``at``, ``failure_reason``, ``stop_reason``) or ``"progress"`` (``steps``, ``commits``,
    ``files_changed``)."""

    event: str
    state: Optional[str] = None
    at: Optional[datetime] = None
    failure_reason: Optional[str] = None
    stop_reason: Optional[str] = None
    steps: Optional[int] = None
    commits: Optional[int] = None
    files_changed: Optional[int] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def finished(self) -> bool:
        """True for the state event of a terminal state (the stream ends after it)."""
        return self.event == "state" and self.state in TASK_TERMINAL_STATES

    @classmethod
    def from_sse(cls, event: str, d: Optional[Mapping[str, Any]]) -> "TaskEvent":
        d = d or {}

        def opt_int(key: str) -> Optional[int]:
            return None if d.get(key) is None else int(d[key])

        return cls(
            event=str(d.get("event") or event),
            state=d.get("state"),
            at=parse_time(d.get("at")),
            failure_reason=d.get("failure_reason"),
            stop_reason=d.get("stop_reason"),
            steps=opt_int("steps"),
            commits=opt_int("commits"),
            files_changed=opt_int("files_changed"),
            raw=dict(d),
        )


@dataclass
class TaskLogChunk:
    """A piece of a running task's agent output (``GET /api/v1/tasks/{id}/log``)."""

    stream: str
    text: str


# --------------------------------------------------------------------------- workspaces and money


@dataclass
class WorkspaceInfo:
    """A workspace (``GET /api/v1/workspaces/{id}``); ``settings`` as the server answers them
    (``tasks_enabled``, ``compute_rate``, ``session_limit_min``, ``heartbeat_timeout_sec``,
    ``model_allowlist``, ``task_runtime``)."""

    id: str
    name: str
    plan: str
    kind: str
    created_at: Optional[datetime]
    settings: Dict[str, Any]
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def tasks_enabled(self) -> bool:
        return bool(self.settings.get("tasks_enabled"))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "WorkspaceInfo":
        return cls(
            id=d["id"],
            name=d.get("name", ""),
            plan=d.get("plan", ""),
            kind=d.get("kind", ""),
            created_at=parse_time(d.get("created_at")),
            settings=dict(d.get("settings") or {}),
            raw=dict(d),
        )


@dataclass
class Wallet:
    """A workspace's wallet: ``available = balance - reserved``, exact decimals."""

    balance: Decimal
    reserved: Decimal
    available: Decimal
    currency: str
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Wallet":
        return cls(
            balance=parse_money(d.get("balance")),
            reserved=parse_money(d.get("reserved")),
            available=parse_money(d.get("available")),
            currency=d.get("currency", ""),
            raw=dict(d),
        )


@dataclass
class LedgerEntry:
    """One entry of a workspace's ledger: ``kind`` is ``credit``, ``compute``, ``model`` or
    ``refund``; credits and refunds are positive, charges negative."""

    id: str
    at: Optional[datetime]
    kind: str
    amount: Decimal
    balance_after: Decimal
    sandbox_id: Optional[str] = None
    task_id: Optional[str] = None
    reference: Optional[str] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "LedgerEntry":
        return cls(
            id=d["id"],
            at=parse_time(d.get("at")),
            kind=d.get("kind", ""),
            amount=parse_money(d.get("amount")),
            balance_after=parse_money(d.get("balance_after")),
            sandbox_id=d.get("sandbox_id"),
            task_id=d.get("task_id"),
            reference=d.get("reference"),
            raw=dict(d),
        )


@dataclass
class UsageFigures:
    """Usage figures of a day or a range (costs are positive amounts)."""

    compute_sec: int
    compute_cost: Decimal
    model_requests: int
    input_tokens: int
    output_tokens: int
    model_cost: Decimal
    date: Optional[str] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "UsageFigures":
        return cls(
            compute_sec=int(d.get("compute_sec") or 0),
            compute_cost=parse_money(d.get("compute_cost")),
            model_requests=int(d.get("model_requests") or 0),
            input_tokens=int(d.get("input_tokens") or 0),
            output_tokens=int(d.get("output_tokens") or 0),
            model_cost=parse_money(d.get("model_cost")),
            date=d.get("date"),
            raw=dict(d),
        )


@dataclass
class WorkspaceUsage:
    """A workspace's usage per UTC day over ``[from_, to)`` (``GET .../usage``): only days
    with usage, oldest first, and the totals."""

    from_: Optional[datetime]
    to: Optional[datetime]
    currency: str
    days: List[UsageFigures]
    totals: UsageFigures
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "WorkspaceUsage":
        return cls(
            from_=parse_time(d.get("from")),
            to=parse_time(d.get("to")),
            currency=d.get("currency", ""),
            days=[UsageFigures.from_dict(x) for x in d.get("days") or []],
            totals=UsageFigures.from_dict(d.get("totals") or {}),
            raw=dict(d),
        )


@dataclass
class WorkspaceStorage:
    """What a workspace's kept objects take, against its quota (None: no quota)."""

    used_bytes: int
    quota_bytes: Optional[int]
    snapshots_bytes: int
    artifacts_bytes: int
    images_bytes: int
    templates_bytes: int
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "WorkspaceStorage":
        return cls(
            used_bytes=int(d.get("used_bytes") or 0),
            quota_bytes=None if d.get("quota_bytes") is None else int(d["quota_bytes"]),
            snapshots_bytes=int(d.get("snapshots_bytes") or 0),
            artifacts_bytes=int(d.get("artifacts_bytes") or 0),
            images_bytes=int(d.get("images_bytes") or 0),
            templates_bytes=int(d.get("templates_bytes") or 0),
            raw=dict(d),
        )


@dataclass
class ApiKeyInfo:
    """An API key. ``key`` (the secret) is only there in the answer of its creation."""

    id: str
    workspace_id: str
    name: str
    scopes: List[str]
    prefix: str
    created_at: Optional[datetime]
    expires_at: Optional[datetime] = None
    last_used_at: Optional[datetime] = None
    key: Optional[str] = field(default=None, repr=False)
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ApiKeyInfo":
        return cls(
            id=d["id"],
            workspace_id=d.get("workspace_id", ""),
            name=d.get("name", ""),
            scopes=[str(s) for s in d.get("scopes") or []],
            prefix=d.get("prefix", ""),
            created_at=parse_time(d.get("created_at")),
            expires_at=parse_time(d.get("expires_at")),
            last_used_at=parse_time(d.get("last_used_at")),
            key=d.get("key"),
            raw=dict(d),
        )


@dataclass
class MemberInfo:
    """A member of an organization workspace: ``role`` is ``owner``, ``admin`` or ``member``."""

    user_id: str
    email: str
    name: str
    role: str

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "MemberInfo":
        return cls(user_id=d["user_id"], email=d.get("email", ""), name=d.get("name", ""), role=d.get("role", ""))


@dataclass
class UserInfo:
    """A person who signs in to the dashboard."""

    id: str
    email: str
    name: str
    created_at: Optional[datetime]

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "UserInfo":
        return cls(id=d["id"], email=d.get("email", ""), name=d.get("name", ""), created_at=parse_time(d.get("created_at")))


@dataclass
class ImageInfo:
    """A container image imported into the workspace (``POST /api/v1/images``), to build
    templates ``from`` it."""

    id: str
    reference: str
    name: str
    digest: str
    layers: int
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ImageInfo":
        return cls(id=d["id"], reference=d.get("reference", ""), name=d.get("name", ""), digest=d.get("digest", ""),
                   layers=int(d.get("layers") or 0), raw=dict(d))
