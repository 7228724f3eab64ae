"""Sandboxes: create, connect, list, lifecycle, timeout, usage, fork, expose, and the
client's configuration and errors."""

from __future__ import annotations

import time

import httpx
import pytest

from conftest import SIZE, Server, ghost, skip_if_route_missing

import cella
from cella import (
    AuthenticationError,
    CellaConnectionError,
    CellaError,
    ConflictError,
    InvalidRequestError,
    NetworkPolicy,
    NotFoundError,
    PermissionDeniedError,
    Sandbox,
    SandboxInfo,
    SandboxNotRunningError,
    SandboxUsage,
    UnknownRouteError,
)

# --------------------------------------------------------------------------- create


def test_create_with_every_option(server: Server, tag: str) -> None:
    with Sandbox.create(
        template="base",
        size=SIZE,
        timeout=900,
        metadata={"test": tag, "kind": "full"},
        env={"GREETING": "hello sandbox"},
        network=NetworkPolicy(egress="allow", allow=["10.20.0.0/16"], deny=["203.0.113.0/24"]),
        idle_timeout=0,
        persistent=True,
    ) as sb:
        info = sb.info
        assert isinstance(info, SandboxInfo)
        assert sb.id.startswith("sb") and sb.id == info.id == sb.sandbox_id
        assert info.state == sb.state == "running" and info.ready
        assert info.template_id == "base" and info.size == SIZE
        assert info.cpu_count == 1 and info.memory_mb == 1024 and info.disk_size_mb == 4096
        assert info.resource_contract["contract_id"] == f"sandbox/{SIZE}@v1"
        assert info.timeout_sec == 900 and 0 < info.timeout_remaining_ms <= 900_000
        assert info.idle_timeout_sec == 0 and info.persistent and not info.always_on
        assert info.metadata == {"test": tag, "kind": "full"}
        assert info.network == NetworkPolicy("allow", ["10.20.0.0/16"], ["203.0.113.0/24"])
        assert info.created_at is not None and info.created_at.tzinfo is not None
        assert info.started_at is not None and info.destroyed_at is None
        assert info.raw["id"] == sb.id
        # money: exact decimals (the test server's workspace has a rate of 0)
        assert info.raw["compute_rate"] == "0.000000" and info.compute_rate == 0
        assert info.compute_cost == 0 and info.model_cost == 0
        # the sandbox's env reaches its commands
        assert sb.commands.run("echo $GREETING").stdout == "hello sandbox\n"
    # the context manager destroyed it
    assert Sandbox.connect(info.id).info.state == "destroyed"


def test_create_network_as_dict_and_defaults(server: Server) -> None:
    with Sandbox.create(size=SIZE, network={"egress": "deny"}) as sb:
        assert sb.info.network == NetworkPolicy("deny", [], [])
    with Sandbox.create() as sb:
        # the template's default size and the server's default timeout
        assert sb.info.size == "small" and sb.info.timeout_sec == 3600
        assert sb.info.network == NetworkPolicy("allow", [], [])


@pytest.mark.parametrize(
    "kwargs, error, field",
    [
        ({"template": "no-such-template"}, NotFoundError, None),
        ({"size": "huge"}, InvalidRequestError, "size"),
        ({"timeout": 0}, InvalidRequestError, "timeout_sec"),
        ({"timeout": 86401}, InvalidRequestError, "timeout_sec"),
        ({"metadata": {"bad key!": "x"}}, InvalidRequestError, "metadata"),
        ({"env": {"A=B": "x"}}, InvalidRequestError, "env"),
        ({"network": {"egress": "sometimes"}}, InvalidRequestError, "network.egress"),
        ({"network": {"allow": ["::1"]}}, InvalidRequestError, "network.allow"),
        ({"extra": {"no_such_field": 1}}, InvalidRequestError, None),
    ],
)
def test_create_errors(server: Server, kwargs, error, field) -> None:
    before = {s.id for s in Sandbox.list(state="running")}
    kw = dict(kwargs)
    with pytest.raises(error) as ei:
        Sandbox.create(size=kw.pop("size", SIZE), **kw)
    err = ei.value
    assert type(err) is error  # not UnknownRouteError, nor a broader class
    assert err.status in (400, 404) and err.code in ("INVALID_REQUEST", "NOT_FOUND")
    assert err.request_id and err.message
    if field:
        assert (err.field or "").startswith(field), err.details
    assert {s.id for s in Sandbox.list(state="running")} == before  # nothing was made


def test_create_without_waiting_then_wait_ready(server: Server) -> None:
    sb = Sandbox.create(size=SIZE, wait=False)
    try:
        assert sb.state in ("provisioning", "running")
        info = sb.wait_ready(timeout=60)
        assert info.state == "running" and info.ready
        assert sb.commands.run("true").exit_code == 0
        sb.kill()
        with pytest.raises(cella.UnavailableError):
            sb.wait_ready(timeout=5)  # destroyed: it never gets ready again
    finally:
        sb.kill()
        sb.close()


def test_context_manager_destroys_on_error(server: Server) -> None:
    with pytest.raises(RuntimeError):
        with Sandbox.create(size=SIZE) as sb:
            sid = sb.id
            raise RuntimeError("boom")
    assert Sandbox.connect(sid).info.state == "destroyed"


# --------------------------------------------------------------------------- connect and list


def test_connect(server: Server, sandbox: Sandbox) -> None:
    other = Sandbox.connect(sandbox.id)
    try:
        assert other.id == sandbox.id and other.state == "running"
        other.files.write("/home/user/shared.txt", "from the other handle")
        assert sandbox.files.read("/home/user/shared.txt") == "from the other handle"
    finally:
        other.close()  # closing a handle leaves the sandbox alone
    assert sandbox.refresh().state == "running"


def test_connect_wakes_unless_asked_not_to(server: Server, sandbox: Sandbox) -> None:
    sandbox.pause()
    same = Sandbox.connect(sandbox.id, resume=False)
    assert same.state == "paused"
    same.close()
    woken = Sandbox.connect(sandbox.id)
    assert woken.state == "running"
    woken.close()
    assert sandbox.refresh().state == "running"


def test_connect_unknown(server: Server) -> None:
    with pytest.raises(NotFoundError) as ei:
        Sandbox.connect("sbnosuchsandbox00000")
    assert not isinstance(ei.value, UnknownRouteError)
    assert ei.value.status == 404 and ei.value.code == "NOT_FOUND"


def test_connect_other_workspace_is_not_found(server: Server, admin: httpx.Client, make_key, sandbox: Sandbox) -> None:
    ws = admin.post("/workspaces", json={"name": "sdk-other"}).json()["data"]
    key = make_key(["admin"], workspace=ws["id"])["key"]
    with pytest.raises(NotFoundError):
        Sandbox.connect(sandbox.id, api_key=key)
    assert sandbox.id not in {s.id for s in Sandbox.list(api_key=key)}


def test_list_filters_and_pages(server: Server, tag: str) -> None:
    made = [Sandbox.create(size=SIZE, metadata={"test": tag, "n": str(i)}) for i in range(3)]
    try:
        made[0].pause()
        mine = Sandbox.list(metadata={"test": tag})
        assert [s.id for s in mine] == [s.id for s in reversed(made)]  # newest first
        assert all(isinstance(s, SandboxInfo) for s in mine)
        assert [s.id for s in Sandbox.list(metadata={"test": tag, "n": "1"})] == [made[1].id]
        assert [s.id for s in Sandbox.list(state="paused", metadata={"test": tag})] == [made[0].id]
        running = Sandbox.list(state="running", metadata={"test": tag})
        assert {s.id for s in running} == {made[1].id, made[2].id}
        # pages of one are followed to the end; limit stops early
        assert [s.id for s in Sandbox.list(metadata={"test": tag}, page_size=1)] == [s.id for s in mine]
        assert [s.id for s in Sandbox.list(metadata={"test": tag}, limit=2, page_size=1)] == [s.id for s in mine[:2]]
        # lazy: a page at a time as the iteration goes; stopping early reads no more pages
        pages = Sandbox.list(metadata={"test": tag}, page_size=1)
        assert isinstance(pages, cella.SandboxPages)
        it = iter(pages)
        assert next(it).id == made[2].id and next(it).id == made[1].id
        assert len(pages) == 3 and pages[0].id == made[2].id
        # destroyed sandboxes are listed too, in their state
        made[2].kill()
        assert [s.id for s in Sandbox.list(state="destroyed", metadata={"test": tag})] == [made[2].id]
    finally:
        for sb in made:
            sb.kill()
            sb.close()


def test_list_errors(server: Server) -> None:
    with pytest.raises(InvalidRequestError) as ei:
        Sandbox.list(state="sleeping")
    assert ei.value.field == "state"


# --------------------------------------------------------------------------- configuration


def test_configuration_from_arguments_beats_environment(server: Server, monkeypatch) -> None:
    monkeypatch.setenv("CELLA_SERVER", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("CELLA_API_KEY", "wrong")
    with pytest.raises(CellaConnectionError):
        Sandbox.list()
    infos = Sandbox.list(server=server.url + "/api/v1/", api_key=server.api_key, limit=1)
    assert isinstance(infos, cella.SandboxPages) and isinstance(infos.all(), list)
    monkeypatch.setenv("CELLA_SERVER", server.url)
    with pytest.raises(AuthenticationError):
        Sandbox.list()


def test_connection_config_defaults(monkeypatch) -> None:
    monkeypatch.delenv("CELLA_SERVER", raising=False)
    monkeypatch.delenv("CELLA_API_KEY", raising=False)
    cfg = cella.ConnectionConfig.resolve()
    assert cfg.server == "http://127.0.0.1:7070" and cfg.api_key is None and cfg.max_retries == 3
    assert cella.ConnectionConfig.resolve(server="example.test:1/").api_url == "http://example.test:1/api/v1"
    with pytest.raises(ValueError):
        cella.ConnectionConfig.resolve(max_retries=-1)


def test_missing_and_bad_keys(server: Server, monkeypatch) -> None:
    monkeypatch.delenv("CELLA_API_KEY")
    with pytest.raises(AuthenticationError) as ei:
        Sandbox.create(size=SIZE)
    err = ei.value
    assert err.status == 401 and err.code == "UNAUTHORIZED" and "Authorization" in err.message
    assert err.request_id and err.request_id.startswith("req")
    assert "UNAUTHORIZED" in str(err) and err.request_id in str(err)
    with pytest.raises(AuthenticationError):
        Sandbox.list(api_key="not-a-key")


def test_scopes(server: Server, make_key, tag: str) -> None:
    write_only = make_key(["sandboxes:write"])["key"]
    # a key may create without being able to read or run anything
    sb = Sandbox.create(size=SIZE, api_key=write_only, metadata={"test": tag})
    try:
        with pytest.raises(PermissionDeniedError) as ei:
            sb.usage()
        assert ei.value.status == 403 and ei.value.details["required_scope"] == "sandboxes:read"
        with pytest.raises(PermissionDeniedError):
            sb.commands.run("true")
        with pytest.raises(PermissionDeniedError):
            sb.refresh()
        assert sb.pause().state == "paused"
    finally:
        sb.kill()
        sb.close()


# --------------------------------------------------------------------------- lifecycle


def test_refresh_and_info(server: Server, sandbox: Sandbox) -> None:
    before = sandbox.info
    sandbox.set_timeout(700)
    assert before.timeout_sec == 600  # the old view is not changed in place
    info = sandbox.refresh()
    assert info is sandbox.info and info.timeout_sec == 700
    assert sandbox.get_info().id == sandbox.id
    assert sandbox.is_running()
    assert "Sandbox(" in repr(sandbox)


def test_pause_and_resume(server: Server, sandbox: Sandbox) -> None:
    sandbox.files.write("/home/user/keep.txt", "kept")
    handle = sandbox.commands.start("sleep 1000")
    info = sandbox.pause()
    assert info.state == "paused" and not info.ready and info.timeout_remaining_ms is None
    assert sandbox.state == "paused"
    # nothing runs in a paused sandbox, and nothing wakes it
    with pytest.raises(SandboxNotRunningError) as ei:
        sandbox.commands.run("true")
    assert ei.value.status == 409 and ei.value.code == "SANDBOX_NOT_RUNNING"
    assert sandbox.refresh().state == "paused"
    with pytest.raises(ConflictError) as ei2:
        sandbox.pause()
    assert ei2.value.details["state"] == "paused"
    info = sandbox.resume()
    assert info.state == "running" and info.ready
    # memory and processes survived
    assert handle.refresh().state == "running"
    assert sandbox.files.read("/home/user/keep.txt") == "kept"
    with pytest.raises(ConflictError) as ei3:
        sandbox.resume()
    assert ei3.value.details["state"] == "running"


def test_stop_and_resume(server: Server, sandbox: Sandbox) -> None:
    sandbox.files.write("/home/user/keep.txt", "on disk")
    info = sandbox.stop()
    assert info.state == "stopped" and not info.ready
    with pytest.raises(ConflictError):
        sandbox.stop()
    with pytest.raises(SandboxNotRunningError):
        sandbox.files.read("/home/user/keep.txt")
    assert sandbox.resume().state == "running"
    assert sandbox.files.read("/home/user/keep.txt") == "on disk"


def test_stop_refused_for_non_persistent(server: Server) -> None:
    with Sandbox.create(size=SIZE, persistent=False) as sb:
        with pytest.raises(ConflictError) as ei:
            sb.stop()
        assert ei.value.details == {"state": "running", "persistent": False}
        assert sb.refresh().state == "running"


def test_set_timeout(server: Server, sandbox: Sandbox) -> None:
    info = sandbox.set_timeout(120)
    assert info.timeout_sec == 120 and 0 < info.timeout_remaining_ms <= 120_000
    assert sandbox.set_timeout(30.2).timeout_sec == 31  # rounded up to whole seconds
    with pytest.raises(InvalidRequestError) as ei:
        sandbox.set_timeout(0)
    assert ei.value.field == "timeout_sec"
    sandbox.kill()
    with pytest.raises(ConflictError) as ei2:
        sandbox.set_timeout(60)
    assert ei2.value.details["state"] == "destroyed"


def test_timeout_pauses_sandbox(server: Server, sandbox: Sandbox) -> None:
    sandbox.set_timeout(1)
    deadline = time.monotonic() + 10
    while sandbox.refresh().state == "running" and time.monotonic() < deadline:
        time.sleep(0.2)
    assert sandbox.state == "paused"
    assert "timeout" in (sandbox.info.state_reason or "")


def test_usage(server: Server, sandbox: Sandbox) -> None:
    sandbox.commands.run("python3 -c 'sum(range(3_000_000))'")
    usage = sandbox.usage()
    assert isinstance(usage, SandboxUsage)
    assert usage.sandbox_id == sandbox.id and usage.state == "running"
    assert usage.running_sec > 0 and usage.billed_sec >= 1 and usage.cpu_sec > 0
    assert usage.memory_mib_now is not None and usage.measured_at is not None
    sandbox.kill()
    after = sandbox.usage()  # readable after destroy too
    assert after.state == "destroyed" and after.memory_mib_now is None
    with pytest.raises(NotFoundError):
        ghost().usage()


def test_kill(server: Server, sandbox: Sandbox) -> None:
    info = sandbox.kill()
    assert info.state == "destroyed" and info.destroyed_at is not None
    assert info.total_runtime_sec is not None and info.total_runtime_sec >= 0
    assert sandbox.kill().state == "destroyed"  # idempotent
    with pytest.raises(SandboxNotRunningError):
        sandbox.commands.run("true")
    with pytest.raises(ConflictError):
        sandbox.resume()
    with pytest.raises(NotFoundError):
        ghost().kill()


# every route answers 404 NOT_FOUND (and not "no such route") for a sandbox that does not exist
GHOST_CALLS = {
    "refresh": lambda s: s.refresh(),
    "pause": lambda s: s.pause(),
    "resume": lambda s: s.resume(),
    "stop": lambda s: s.stop(),
    "set_timeout": lambda s: s.set_timeout(60),
    "commands.run": lambda s: s.commands.run("true"),
    "commands.run streamed": lambda s: s.commands.run("true", on_stdout=print),
    "commands.start": lambda s: s.commands.start("true"),
    "commands.list": lambda s: s.commands.list(),
    "files.read": lambda s: s.files.read("/etc/hostname"),
    "files.write": lambda s: s.files.write("/tmp/x", "x"),
    "files.list": lambda s: s.files.list("/"),
    "files.stat": lambda s: s.files.stat("/"),
    "files.remove": lambda s: s.files.remove("/tmp/x"),
    "files.make_dir": lambda s: s.files.make_dir("/tmp/x"),
    "files.rename": lambda s: s.files.rename("/tmp/x", "/tmp/y"),
    "files.watch": lambda s: s.files.watch("/tmp"),
    "run_code": lambda s: s.run_code("1"),
}


@pytest.mark.parametrize("call", list(GHOST_CALLS), ids=list(GHOST_CALLS))
def test_unknown_sandbox_is_not_found(server: Server, call: str) -> None:
    sb = ghost()
    try:
        with pytest.raises(NotFoundError) as ei:
            GHOST_CALLS[call](sb)
        if isinstance(ei.value, UnknownRouteError):
            skip_if_route_missing(ei.value, call)
        assert ei.value.status == 404 and ei.value.request_id
    finally:
        sb.close()


# --------------------------------------------------------------------------- fork and expose

FORK = "POST /api/v1/sandboxes/{id}/fork"
EXPOSE = "POST /api/v1/sandboxes/{id}/expose"


def test_fork(server: Server, sandbox: Sandbox, tag: str) -> None:
    sandbox.files.write("/home/user/state.txt", "before the fork")
    try:
        children = sandbox.fork(count=2, metadata={"test": tag, "role": "child"})
    except UnknownRouteError as exc:
        skip_if_route_missing(exc, FORK)
        raise
    try:
        assert len(children) == 2 and all(isinstance(c, Sandbox) for c in children)
        assert len({c.id for c in children} | {sandbox.id}) == 3
        for child in children:
            assert child.info.metadata.get("role") == "child"
            if child.state != "running":
                child.wait_ready(timeout=60)
            assert child.files.read("/home/user/state.txt") == "before the fork"
        children[0].files.write("/home/user/state.txt", "changed in a child")
        assert sandbox.files.read("/home/user/state.txt") == "before the fork"
    finally:
        for child in children:
            child.kill()
            child.close()


def test_fork_errors(server: Server, sandbox: Sandbox) -> None:
    try:
        with pytest.raises(InvalidRequestError) as ei:
            sandbox.fork(count=0)
    except UnknownRouteError as exc:
        skip_if_route_missing(exc, FORK)
        raise
    assert ei.value.field in (None, "count")
    with pytest.raises(InvalidRequestError):
        sandbox.fork(count=11)
    with pytest.raises(NotFoundError) as ei2:
        ghost().fork()
    assert not isinstance(ei2.value, UnknownRouteError)
    sandbox.kill()
    with pytest.raises(CellaError) as ei3:
        sandbox.fork()
    assert ei3.value.status in (404, 409) and not isinstance(ei3.value, UnknownRouteError)


def test_expose(server: Server, sandbox: Sandbox) -> None:
    sandbox.files.write("/home/user/site/index.html", "hello through the preview")
    web = sandbox.commands.start("python3 -m http.server 8000 --bind 0.0.0.0", cwd="/home/user/site", tag="web")
    try:
        try:
            url = sandbox.expose(8000)
        except UnknownRouteError as exc:
            skip_if_route_missing(exc, EXPOSE)
            raise
        assert isinstance(url, str) and url.startswith(("http://", "https://")) and "8000" in url
        info = sandbox.expose_info(8000)
        assert isinstance(info, cella.ExposedPort) and info.port == 8000 and info.url == url
        assert info.token is None and info.token_expires_at is None
        # the host-name form <port>-<id>.<preview domain> is the sandbox's own origin (browsers)
        assert info.host_url is not None and httpx.URL(info.host_url).host.startswith(f"8000-{sandbox.id}.")
        # get_host: that origin's host, without a scheme, as E2B's SDK answers it
        assert sandbox.get_host(8000) == httpx.URL(info.host_url).netloc.decode()
        # the URL handed out opens with httpx as it is (the preview domain is localhost, which
        # httpx does not resolve: the URL is the path form on the server's address)
        deadline = time.monotonic() + 20
        while True:
            r = httpx.get(url, timeout=10)
            if r.status_code == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.2)  # the web server inside is still starting
        assert r.status_code == 200 and "hello through the preview" in r.text
    finally:
        web.kill()


def test_expose_errors(server: Server, sandbox: Sandbox) -> None:
    try:
        with pytest.raises(InvalidRequestError) as ei:
            sandbox.expose(0)
    except UnknownRouteError as exc:
        skip_if_route_missing(exc, EXPOSE)
        raise
    assert ei.value.field in (None, "port")
    with pytest.raises(NotFoundError) as ei2:
        ghost().expose(8000)
    assert not isinstance(ei2.value, UnknownRouteError)


# --------------------------------------------------------------------------- error plumbing


def test_error_envelope_and_request_id(server: Server) -> None:
    r = httpx.get(server.url + "/api/v1/sandboxes/sbnope", headers={"Authorization": f"Bearer {server.api_key}", "x-request-id": "mine-123"})
    assert r.headers["x-request-id"] == "mine-123"
    err = cella.errors.error_from_body(r.status_code, r.content, request_id=r.headers["x-request-id"])
    assert isinstance(err, NotFoundError) and err.request_id == "mine-123"
    route = httpx.post(server.url + "/api/v1/sandboxes/sbnope/no-such-thing", headers={"Authorization": f"Bearer {server.api_key}"})
    assert isinstance(cella.errors.error_from_body(route.status_code, route.content), UnknownRouteError)


def test_errors_are_cella_errors() -> None:
    for cls in (InvalidRequestError, NotFoundError, UnknownRouteError, SandboxNotRunningError, ConflictError,
                cella.RateLimitedError, cella.ConcurrencyLimitError, AuthenticationError, PermissionDeniedError,
                cella.UnavailableError, cella.InternalServerError, cella.CellaTimeoutError, CellaConnectionError):
        assert issubclass(cls, CellaError)
    assert issubclass(cella.UnknownLanguageError, InvalidRequestError)
    err = cella.errors.error_from_body(502, b"<html>bad gateway</html>", request_id=None)
    assert type(err) is CellaError and err.status == 502 and "bad gateway" in err.message
    err = cella.errors.error_from_body(409, b'{"error":{"code":"SANDBOX_NOT_RUNNING","message":"m","details":null}}')
    assert type(err) is SandboxNotRunningError
    err = cella.errors.error_from_body(400, b'{"error":{"code":"SOMETHING_NEW","message":"m","details":{"field":"x"}}}')
    assert type(err) is InvalidRequestError and err.code == "SOMETHING_NEW" and err.field == "x"
