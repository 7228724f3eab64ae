"""Where the server is and how to talk to it: arguments first, then the environment."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Dict, Optional

DEFAULT_SERVER = "http://127.0.0.1:7070"
DEFAULT_MAX_RETRIES = 3
DEFAULT_REQUEST_TIMEOUT = 120.0
DEFAULT_MAX_RETRY_WAIT = 60.0

ENV_SERVER = "CELLA_SERVER"
ENV_API_KEY = "CELLA_API_KEY"


@dataclass(frozen=True)
class ConnectionConfig:
    """How a client reaches a Cella server.

    ``server`` is the server's base URL (``http://host:port``; a trailing ``/api/v1`` is
    accepted too). ``max_retries`` is how many times a request answered 429 is sent again
    after waiting ``Retry-After`` seconds (never longer than ``max_retry_wait``).
    ``request_timeout`` is the HTTP timeout, in seconds, of calls that do not run a command
    (those wait as long as the command may run).
    """

    server: str = DEFAULT_SERVER
    api_key: Optional[str] = None
    max_retries: int = DEFAULT_MAX_RETRIES
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT
    max_retry_wait: float = DEFAULT_MAX_RETRY_WAIT
    headers: Dict[str, str] = field(default_factory=dict)

    @classmethod
    def resolve(
        cls,
        server: Optional[str] = None,
        api_key: Optional[str] = None,
        max_retries: Optional[int] = None,
        request_timeout: Optional[float] = None,
        max_retry_wait: Optional[float] = None,
        headers: Optional[Dict[str, str]] = None,
    ) -> "ConnectionConfig":
        server = server or os.environ.get(ENV_SERVER) or DEFAULT_SERVER
        if api_key is None:
            api_key = os.environ.get(ENV_API_KEY) or None
        if max_retries is not None and max_retries < 0:
            raise ValueError("max_retries must be 0 or more")
        return cls(
            server=_normalize_server(server),
            api_key=api_key,
            max_retries=DEFAULT_MAX_RETRIES if max_retries is None else int(max_retries),
            request_timeout=DEFAULT_REQUEST_TIMEOUT if request_timeout is None else float(request_timeout),
            max_retry_wait=DEFAULT_MAX_RETRY_WAIT if max_retry_wait is None else float(max_retry_wait),
            headers=dict(headers or {}),
        )

    @property
    def api_url(self) -> str:
        return self.server + "/api/v1"


def _normalize_server(server: str) -> str:
    server = server.strip().rstrip("/")
    if "://" not in server:
        server = "http://" + server
    if server.endswith("/api/v1"):
        server = server[: -len("/api/v1")]
    return server
