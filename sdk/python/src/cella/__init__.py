"""Cella's Python SDK: create sandboxes on a Cella server and run commands, files and code
in them.

Quick start::

    from cella import Sandbox

    with Sandbox.create() as sandbox:          # CELLA_SERVER / CELLA_API_KEY
        print(sandbox.commands.run("uname -a").stdout)
"""

from ._config import DEFAULT_SERVER, ConnectionConfig
from ._version import __version__
from .async_sandbox import (
    AsyncSandboxPages,
    AsyncCodeInterpreter,
    AsyncCommandHandle,
    AsyncCommands,
    AsyncFiles,
    AsyncSandbox,
    AsyncWatchHandle,
)
from .async_resources import AsyncArtifact, AsyncSnapshot, AsyncTemplate, AsyncTemplateBuildHandle
from .errors import (
    AuthenticationError,
    CellaConnectionError,
    CellaError,
    CellaTimeoutError,
    CommandExitError,
    ConcurrencyLimitError,
    ConflictError,
    InsufficientFundsError,
    InternalServerError,
    InvalidRequestError,
    MethodNotAllowedError,
    NotFoundError,
    PayloadTooLargeError,
    PermissionDeniedError,
    RangeNotSatisfiableError,
    RateLimitedError,
    SandboxNotRunningError,
    SizeUnavailableError,
    TemplateBuildError,
    UnavailableError,
    UnknownLanguageError,
    UnknownRouteError,
)
from .models import (
    ArtifactInfo,
    BuildStep,
    CodeContext,
    CommandResult,
    EntryInfo,
    EntryList,
    Execution,
    ExecutionError,
    ExecutionFailed,
    ExposedPort,
    FilesystemEvent,
    KernelInfo,
    NetworkPolicy,
    Output,
    OutputChunk,
    ProcessInfo,
    SandboxInfo,
    RunResult,
    SandboxUsage,
    SnapshotInfo,
    TemplateBuild,
    TemplateInfo,
)
from .resources import Artifact, Snapshot, Template, TemplateBuildHandle
from .sandbox import CodeInterpreter, CommandHandle, Commands, Files, Sandbox, SandboxPages, WatchHandle

__all__ = [
    "__version__",
    "DEFAULT_SERVER",
    "ConnectionConfig",
    # sandboxes
    "Sandbox",
    "SandboxPages",
    "AsyncSandboxPages",
    "AsyncSandbox",
    "Commands",
    "AsyncCommands",
    "CommandHandle",
    "AsyncCommandHandle",
    "Files",
    "AsyncFiles",
    "WatchHandle",
    "AsyncWatchHandle",
    "CodeInterpreter",
    "AsyncCodeInterpreter",
    # snapshots, artifacts, templates
    "Snapshot",
    "AsyncSnapshot",
    "Artifact",
    "AsyncArtifact",
    "Template",
    "AsyncTemplate",
    "TemplateBuildHandle",
    "AsyncTemplateBuildHandle",
    # data
    "SandboxInfo",
    "SandboxUsage",
    "NetworkPolicy",
    "CommandResult",
    "ProcessInfo",
    "OutputChunk",
    "EntryInfo",
    "EntryList",
    "FilesystemEvent",
    "Execution",
    "ExecutionError",
    "ExecutionFailed",
    "Output",
    "ExposedPort",
    "CodeContext",
    "KernelInfo",
    "SnapshotInfo",
    "RunResult",
    "ArtifactInfo",
    "TemplateInfo",
    "TemplateBuild",
    "BuildStep",
    # errors
    "CellaError",
    "InvalidRequestError",
    "UnknownLanguageError",
    "SizeUnavailableError",
    "AuthenticationError",
    "InsufficientFundsError",
    "PermissionDeniedError",
    "NotFoundError",
    "UnknownRouteError",
    "MethodNotAllowedError",
    "ConflictError",
    "SandboxNotRunningError",
    "PayloadTooLargeError",
    "RangeNotSatisfiableError",
    "RateLimitedError",
    "ConcurrencyLimitError",
    "InternalServerError",
    "UnavailableError",
    "CellaTimeoutError",
    "CellaConnectionError",
    "CommandExitError",
    "TemplateBuildError",
]
