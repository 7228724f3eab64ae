"""Snapshots: take one, start a sandbox from it, list, get, delete; with memory on gVisor (a
sandbox made from it continues where the source was); sync and async."""

from __future__ import annotations

import asyncio
import shutil

import pytest

from conftest import SIZE, Server, ghost

from cella import AsyncSandbox, AsyncSnapshot, InvalidRequestError, NotFoundError, Sandbox, Snapshot, SnapshotInfo

GHOST_SNAPSHOT = "snap000000000000000000"

needs_runsc = pytest.mark.skipif(shutil.which("runsc") is None, reason="runsc (gVisor) is not installed: no gvisor sandboxes here")


def test_snapshot_restore_and_delete(server: Server, sandbox: Sandbox) -> None:
    path = "/home/user/state.txt"
    sandbox.files.write(path, "before\n")
    snap = sandbox.create_snapshot()
    assert isinstance(snap, SnapshotInfo)
    assert snap.id.startswith("snap") and snap.sandbox_id == sandbox.id
    assert snap.template_id == "base" and snap.size == SIZE
    assert snap.created_at is not None and snap.size_bytes > 0
    assert snap.memory is False
    sandbox.files.write(path, "after\n")
    try:
        assert Snapshot.get(snap.id) == snap
        assert snap.id in [s.id for s in Snapshot.list()]
        with Sandbox.create(snapshot_id=snap.id, timeout=300) as restored:
            assert restored.id != sandbox.id
            assert restored.info.template_id == "base" and restored.info.size == SIZE
            assert restored.files.read(path) == "before\n"
        assert sandbox.files.read(path) == "after\n"
    finally:
        deleted = Snapshot.delete(snap.id)
    assert deleted.id == snap.id
    with pytest.raises(NotFoundError):
        Snapshot.get(snap.id)
    assert snap.id not in [s.id for s in Snapshot.list()]
    # a deleted snapshot cannot be started from
    with pytest.raises(NotFoundError):
        Sandbox.create(snapshot_id=snap.id)


def test_unknown_snapshot_is_404(server: Server) -> None:
    with pytest.raises(NotFoundError) as exc:
        Snapshot.get(GHOST_SNAPSHOT)
    assert exc.value.status == 404 and exc.value.code == "NOT_FOUND"
    with pytest.raises(NotFoundError):
        Snapshot.delete(GHOST_SNAPSHOT)
    with pytest.raises(NotFoundError):
        Sandbox.create(snapshot_id=GHOST_SNAPSHOT)
    with pytest.raises(NotFoundError):
        ghost().create_snapshot()


def test_async_snapshot(server: Server) -> None:
    async def main() -> None:
        async with AsyncSandbox.create(size=SIZE, timeout=300) as sb:
            await sb.files.write("/home/user/a.txt", "one")
            snap = await sb.create_snapshot()
            try:
                await sb.files.write("/home/user/a.txt", "two")
                assert (await AsyncSnapshot.get(snap.id)).id == snap.id
                assert snap.id in [s.id for s in await AsyncSnapshot.list(limit=10)]
                async with AsyncSandbox.create(snapshot_id=snap.id) as copy:
                    assert await copy.files.read("/home/user/a.txt") == "one"
            finally:
                assert (await AsyncSnapshot.delete(snap.id)).id == snap.id
            with pytest.raises(NotFoundError):
                await AsyncSnapshot.get(snap.id)

    asyncio.run(main())


@needs_runsc
def test_snapshot_with_memory_continues_where_the_source_was(server: Server) -> None:
    sb = Sandbox.create(size=SIZE, timeout=300, runtime="gvisor")
    try:
        sb.run_code("counter = 41").raise_error()
        sb.files.write("/home/user/kept.txt", "file too\n")
        snap = sb.create_snapshot(memory=True)
        try:
            assert snap.memory is True and snap.sandbox_id == sb.id and snap.size_bytes > 0
            assert Snapshot.get(snap.id) == snap
            sb.run_code("counter = 0").raise_error()  # the source goes on; the snapshot does not
            with Sandbox.create(snapshot_id=snap.id, timeout=300) as copy:
                assert copy.id != sb.id and copy.info.runtime == "gvisor"
                assert copy.run_code("counter + 1").text == "42"
                assert copy.files.read("/home/user/kept.txt") == "file too\n"
            assert sb.run_code("counter").text == "0"
        finally:
            assert Snapshot.delete(snap.id).id == snap.id
        # a fork of a gvisor sandbox carries its memory too, as it is now
        (child,) = sb.fork()
        with child:
            assert child.info.runtime == "gvisor"
            assert child.run_code("counter + 2").text == "2"
    finally:
        sb.kill()


def test_snapshot_with_memory_of_a_namespace_sandbox_is_a_400(server: Server, sandbox: Sandbox) -> None:
    assert sandbox.info.runtime == "namespace"
    with pytest.raises(InvalidRequestError) as err:
        sandbox.create_snapshot(memory=True)
    assert err.value.status == 400 and err.value.code == "INVALID_REQUEST"
    assert err.value.field == "memory" and "namespace" in err.value.message
    assert sandbox.id not in [s.sandbox_id for s in Snapshot.list()]  # nothing was made
    assert sandbox.refresh().state == "running"


@needs_runsc
def test_async_snapshot_with_memory(server: Server) -> None:
    async def main() -> None:
        async with AsyncSandbox.create(size=SIZE, timeout=300, runtime="gvisor") as sb:
            (await sb.run_code("word = 'kept'")).raise_error()
            snap = await sb.create_snapshot(memory=True)
            try:
                assert snap.memory is True
                assert (await AsyncSnapshot.get(snap.id)).memory is True
                async with AsyncSandbox.create(snapshot_id=snap.id, timeout=300) as copy:
                    assert (await copy.run_code("word")).text == "'kept'"
            finally:
                await AsyncSnapshot.delete(snap.id)
        async with AsyncSandbox.create(size=SIZE, timeout=300, runtime="namespace") as ns:
            with pytest.raises(InvalidRequestError) as err:
                await ns.create_snapshot(memory=True)
            assert err.value.field == "memory"

    asyncio.run(main())
