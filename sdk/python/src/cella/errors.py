"""Typed exceptions: every error envelope of the server becomes one of these.

The server answers errors as ``{"error": {"code", "message", "details"}}`` with an
``x-request-id`` header. :func:`error_from_response` maps the code (or, for a code this SDK
does not know, the HTTP status) to a subclass of :class:`CellaError`.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any, Dict, Mapping, Optional, Type

if TYPE_CHECKING:  # pragma: no cover
    from .models import CommandResult, TemplateBuild


class CellaError(Exception):
    """Base of every error this SDK raises.

    ``code`` is the server's error code (``NOT_FOUND``, ``SANDBOX_NOT_RUNNING``, ...), or one
    of this SDK's own (``TIMEOUT``, ``CONNECTION_ERROR``, ``COMMAND_EXIT``) for failures that
    never reached an answer. ``status`` is the HTTP status (None when there was no answer),
    ``request_id`` the answer's ``x-request-id``, which the server's log is keyed on.
    """

    default_code: Optional[str] = None

    def __init__(
        self,
        message: str,
        *,
        code: Optional[str] = None,
        details: Any = None,
        request_id: Optional[str] = None,
        status: Optional[int] = None,
        retry_after: Optional[float] = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code if code is not None else self.default_code
        self.details = details
        self.request_id = request_id
        self.status = status
        self.retry_after = retry_after

    @property
    def field(self) -> Optional[str]:
        """``details.field`` when the server named the field at fault."""
        if isinstance(self.details, dict):
            value = self.details.get("field")
            return value if isinstance(value, str) else None
        return None

    def __str__(self) -> str:
        parts = [f"{self.code}: {self.message}" if self.code else self.message]
        extra = []
        if self.status is not None:
            extra.append(f"HTTP {self.status}")
        if self.request_id:
            extra.append(f"request {self.request_id}")
        if extra:
            parts.append(f"({', '.join(extra)})")
        return " ".join(parts)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(code={self.code!r}, message={self.message!r}, "
            f"status={self.status!r}, request_id={self.request_id!r})"
        )


class InvalidRequestError(CellaError):
    """400: bad JSON, a wrong type, an unknown field, a value out of range."""

    default_code = "INVALID_REQUEST"


class UnknownLanguageError(InvalidRequestError):
    """400: the code interpreter does not know the language."""

    default_code = "UNKNOWN_LANGUAGE"


class SizeUnavailableError(InvalidRequestError):
    """400: the size is ``missing`` on this server."""

    default_code = "SIZE_UNAVAILABLE"


class AuthenticationError(CellaError):
    """401: no API key, or one that is unknown, revoked or expired."""

    default_code = "UNAUTHORIZED"


class InsufficientFundsError(CellaError):
    """402: the workspace's wallet does not cover the request."""

    default_code = "INSUFFICIENT_FUNDS"


class PermissionDeniedError(CellaError):
    """403: the API key lacks the route's scope (``details.required_scope``)."""

    default_code = "FORBIDDEN"


class NotFoundError(CellaError):
    """404: the sandbox, process or path does not exist (or is another workspace's)."""

    default_code = "NOT_FOUND"


class UnknownRouteError(NotFoundError):
    """404 for the route itself: this server does not serve the call yet (an older server,
    or a feature that is not built)."""


class MethodNotAllowedError(CellaError):
    """405: a known path with a method it does not serve."""

    default_code = "METHOD_NOT_ALLOWED"


class ConflictError(CellaError):
    """409: the call is not allowed in the object's state (``details.state``), or a file
    operation on a path of the wrong type."""

    default_code = "CONFLICT"


class SandboxNotRunningError(CellaError):
    """409: the sandbox is not ``running`` (paused, stopped, ...); it was not woken."""

    default_code = "SANDBOX_NOT_RUNNING"


class GoneError(CellaError):
    """410: the thing is gone for good (a task run's live log once the run has ended)."""

    default_code = "GONE"


class RequestTimeoutError(CellaError):
    """408: the request's body stopped coming (the server closed the connection)."""

    default_code = "REQUEST_TIMEOUT"


class PayloadTooLargeError(CellaError):
    """413: the body is over the server's limit (``details.limit``)."""

    default_code = "PAYLOAD_TOO_LARGE"


class RangeNotSatisfiableError(CellaError):
    """416: the requested byte range lies outside the file."""

    default_code = "RANGE_NOT_SATISFIABLE"


class InsufficientStorageError(CellaError):
    """507: the sandbox's disk or the workspace's storage quota is full (``details`` may hold
    ``used_bytes``, ``quota_bytes``, ``needed_bytes``)."""

    default_code = "INSUFFICIENT_STORAGE"


class RateLimitedError(CellaError):
    """429: the workspace used up its requests of a group. Raised once the retries allowed
    by ``max_retries`` are used up; ``retry_after`` is the server's ``Retry-After``."""

    default_code = "RATE_LIMITED"


class ConcurrencyLimitError(RateLimitedError):
    """429: the workspace holds its plan's cap of concurrent sandboxes."""

    default_code = "CONCURRENCY_LIMIT"


class InternalServerError(CellaError):
    """500: a failure on the server; its log has it under ``request_id``."""

    default_code = "INTERNAL"


class UnavailableError(CellaError):
    """503: a sandbox failed to start, or its agent did not answer."""

    default_code = "UNAVAILABLE"


class CellaTimeoutError(CellaError):
    """The client gave up waiting (an HTTP timeout, or a ``timeout=`` of a wait)."""

    default_code = "TIMEOUT"


class CellaConnectionError(CellaError):
    """The server could not be reached, or the connection broke."""

    default_code = "CONNECTION_ERROR"


class CommandExitError(CellaError):
    """A command run with ``check=True`` exited with a code other than 0."""

    default_code = "COMMAND_EXIT"

    def __init__(self, result: "CommandResult") -> None:
        tail = (result.stderr or result.stdout or "").strip().splitlines()[-3:]
        message = f"command exited with code {result.exit_code}"
        if result.timed_out:
            message += " (timed out)"
        if tail:
            message += ": " + " | ".join(tail)
        super().__init__(message, details={"exit_code": result.exit_code})
        self.result = result

    @property
    def exit_code(self) -> int:
        return self.result.exit_code


class TemplateBuildError(CellaError):
    """A template build waited for with ``check=True`` ended ``failed``; ``build`` is its
    last state (``build.log`` holds the whole log)."""

    default_code = "BUILD_FAILED"

    def __init__(self, build: "TemplateBuild") -> None:
        super().__init__(f"build {build.id} of template {build.template_id} failed: {build.error or 'no reason given'}",
                         details={"template_id": build.template_id, "build_id": build.id})
        self.build = build


_BY_CODE: Dict[str, Type[CellaError]] = {
    "INVALID_REQUEST": InvalidRequestError,
    "UNKNOWN_LANGUAGE": UnknownLanguageError,
    "SIZE_UNAVAILABLE": SizeUnavailableError,
    "UNAUTHORIZED": AuthenticationError,
    "INSUFFICIENT_FUNDS": InsufficientFundsError,
    "FORBIDDEN": PermissionDeniedError,
    "NOT_FOUND": NotFoundError,
    "METHOD_NOT_ALLOWED": MethodNotAllowedError,
    "CONFLICT": ConflictError,
    "SANDBOX_NOT_RUNNING": SandboxNotRunningError,
    "GONE": GoneError,
    "REQUEST_TIMEOUT": RequestTimeoutError,
    "PAYLOAD_TOO_LARGE": PayloadTooLargeError,
    "INSUFFICIENT_STORAGE": InsufficientStorageError,
    "RANGE_NOT_SATISFIABLE": RangeNotSatisfiableError,
    "RATE_LIMITED": RateLimitedError,
    "CONCURRENCY_LIMIT": ConcurrencyLimitError,
    "INTERNAL": InternalServerError,
    "UNAVAILABLE": UnavailableError,
}

_BY_STATUS: Dict[int, Type[CellaError]] = {
    400: InvalidRequestError,
    401: AuthenticationError,
    402: InsufficientFundsError,
    403: PermissionDeniedError,
    404: NotFoundError,
    405: MethodNotAllowedError,
    409: ConflictError,
    408: RequestTimeoutError,
    410: GoneError,
    413: PayloadTooLargeError,
    416: RangeNotSatisfiableError,
    429: RateLimitedError,
    500: InternalServerError,
    503: UnavailableError,
    507: InsufficientStorageError,
}

# The message this server gives a 404 for a path it has no route for ("no such route").
_UNKNOWN_ROUTE = re.compile(r"no such route|unknown route|route (does not|doesn't) exist|route not found", re.I)


def parse_retry_after(value: Optional[str]) -> Optional[float]:
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    return max(seconds, 0.0)


def error_from_envelope(
    envelope: Any,
    *,
    status: Optional[int],
    request_id: Optional[str] = None,
    retry_after: Optional[float] = None,
) -> CellaError:
    """The exception for an error envelope (``{"error": {...}}``, or the inner object)."""
    err = envelope.get("error", envelope) if isinstance(envelope, Mapping) else None
    if not isinstance(err, Mapping):
        return _fallback(status, str(envelope), request_id, retry_after)
    code = err.get("code") if isinstance(err.get("code"), str) else None
    message = err.get("message")
    if not isinstance(message, str):
        message = code or "error"
    details = err.get("details")
    cls = _BY_CODE.get(code or "") or _BY_STATUS.get(status or 0, CellaError)
    if cls is NotFoundError and status == 404 and _UNKNOWN_ROUTE.search(message or ""):
        cls = UnknownRouteError
    return cls(message, code=code, details=details, request_id=request_id, status=status, retry_after=retry_after)


def error_from_body(
    status: int,
    body: bytes,
    *,
    request_id: Optional[str] = None,
    retry_after: Optional[float] = None,
) -> CellaError:
    """The exception for an HTTP error answer's body (JSON envelope or anything else)."""
    try:
        parsed = json.loads(body.decode("utf-8")) if body else None
    except (ValueError, UnicodeDecodeError):
        parsed = None
    if isinstance(parsed, Mapping) and isinstance(parsed.get("error"), Mapping):
        return error_from_envelope(parsed, status=status, request_id=request_id, retry_after=retry_after)
    text = body.decode("utf-8", "replace").strip()[:500] if body else ""
    return _fallback(status, text or f"HTTP {status}", request_id, retry_after)


def _fallback(status: Optional[int], message: str, request_id: Optional[str], retry_after: Optional[float]) -> CellaError:
    cls = _BY_STATUS.get(status or 0, CellaError)
    code = cls.default_code if cls is not CellaError else (f"HTTP_{status}" if status else None)
    return cls(message, code=code, request_id=request_id, status=status, retry_after=retry_after)
