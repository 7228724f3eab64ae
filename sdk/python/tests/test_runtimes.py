"""Isolation runtimes: a create names one (``namespace`` or ``gvisor``), the sandbox says which
it runs on, an unknown one is a 400 naming the field, and templates list theirs; sync and async."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from conftest import SIZE, Server

from cella import AsyncSandbox, AsyncTemplate, InvalidRequestError, Sandbox, Template


def test_namespace_runtime(server: Server) -> None:
    with Sandbox.create(size=SIZE, timeout=300, runtime="namespace") as sb:
        assert sb.info.runtime == "namespace"
        assert sb.info.memory is None  # not sent by this server: absent parses as None
        sb.refresh()
        assert sb.info.runtime == "namespace"


def test_gvisor_runtime_runs_on_gvisors_kernel(server: Server) -> None:
    sb = Sandbox.create(size=SIZE, timeout=300, runtime="gvisor")
    try:
        assert sb.info.runtime == "gvisor"
        same = Sandbox.connect(sb.id, resume=False)
        same.close()  # the connection only: the sandbox stays
        assert same.info.runtime == "gvisor"
        inside = sb.commands.run("cat /proc/version; dmesg 2>/dev/null | head -3").stdout
        host = Path("/proc/version").read_text().strip()
        assert inside.splitlines()[0] != host
        assert "gVisor" in inside or "4.4.0" in inside, inside
    finally:
        sb.kill()
    assert sb.id not in [i.id for i in Sandbox.list()]  # live ones only


def test_unknown_runtime_is_a_400_naming_the_field(server: Server) -> None:
    with pytest.raises(InvalidRequestError) as err:
        Sandbox.create(size=SIZE, runtime="vm")
    assert err.value.status == 400 and err.value.code == "INVALID_REQUEST"
    assert err.value.field == "runtime" and "vm" in err.value.message


def test_templates_list_their_runtimes(server: Server) -> None:
    assert "namespace" in Template.get("base").runtimes
    base = next(t for t in Template.list() if t.id == "base")
    assert base.runtimes[0] == "namespace" and "gvisor" in base.runtimes


def test_async_runtime(server: Server) -> None:
    async def main() -> None:
        async with AsyncSandbox.create(size=SIZE, timeout=300, runtime="namespace") as sb:
            assert sb.info.runtime == "namespace"
        with pytest.raises(InvalidRequestError) as err:
            await AsyncSandbox.create(size=SIZE, runtime="vm")
        assert err.value.field == "runtime" and "vm" in err.value.message
        assert "namespace" in (await AsyncTemplate.get("base")).runtimes

    asyncio.run(main())


def test_one_shot_run_on_gvisor(server: Server) -> None:
    r = Sandbox.run("echo hi > out.txt; cat /proc/version", runtime="gvisor", size=SIZE, artifacts=["out.txt"])
    assert r.exit_code == 0, r.stderr
    assert r.stdout.splitlines()[0] != Path("/proc/version").read_text().strip()
    assert [a.path.rsplit("/", 1)[-1] for a in r.artifacts] == ["out.txt"]
    with pytest.raises(InvalidRequestError) as err:
        Sandbox.run("true", runtime="vm")
    assert err.value.field == "runtime"

    async def main() -> None:
        ar = await AsyncSandbox.run("echo async", runtime="gvisor", size=SIZE)
        assert ar.stdout == "async\n"

    asyncio.run(main())
