"""Snapshots: take one, start a sandbox from it, list, get, delete; sync and async."""

from __future__ import annotations

import asyncio

import pytest

from conftest import SIZE, Server, ghost

from cella import AsyncSandbox, AsyncSnapshot, NotFoundError, Sandbox, Snapshot, SnapshotInfo

GHOST_SNAPSHOT = "snap000000000000000000"


def test_snapshot_restore_and_delete(server: Server, sandbox: Sandbox) -> None:
    path = "/home/user/state.txt"
    sandbox.files.write(path, "before\n")
    snap = sandbox.create_snapshot()
    assert isinstance(snap, SnapshotInfo)
    assert snap.id.startswith("snap") and snap.sandbox_id == sandbox.id
    assert snap.template_id == "base" and snap.size == SIZE
    assert snap.created_at is not None and snap.size_bytes > 0
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
