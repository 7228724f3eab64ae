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
    AsyncCodeInterpreter,
    AsyncCommandHandle,
    AsyncCommands,
    AsyncFiles,
    AsyncSandbox,
    AsyncWatchHandle,
)
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
    UnavailableError,
    UnknownLanguageError,
    UnknownRouteError,
)
from .models import (
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
    SandboxUsage,
)
from .sandbox import CodeInterpreter, CommandHandle, Commands, Files, Sandbox, WatchHandle

__all__ = [
    "__version__",
    "DEFAULT_SERVER",
    "ConnectionConfig",
    # sandboxes
    "Sandbox",
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
]
