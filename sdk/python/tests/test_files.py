"""Files: read, write, list, stat, exists, remove, make_dir, rename, watch."""

from __future__ import annotations

import hashlib
import io
import os
import uuid

import pytest

from cella import (
    ConflictError,
    EntryInfo,
    EntryList,
    FilesystemEvent,
    InvalidRequestError,
    NotFoundError,
    Sandbox,
    SandboxNotRunningError,
    WatchHandle,
)


@pytest.fixture
def d(shared: Sandbox) -> str:
    """A fresh directory of the shared sandbox for one test."""
    path = f"/home/user/t-{uuid.uuid4().hex[:8]}"
    shared.files.make_dir(path)
    return path


def test_write_and_read(shared: Sandbox, d: str) -> None:
    entry = shared.files.write(f"{d}/hello.txt", "héllo\n")
    assert isinstance(entry, EntryInfo)
    assert entry.path == f"{d}/hello.txt" and entry.name == "hello.txt" and entry.is_file
    assert entry.size == len("héllo\n".encode()) and entry.mode == "0644" and entry.uid == 1000
    assert shared.files.read(f"{d}/hello.txt") == "héllo\n"
    assert shared.files.read(f"{d}/hello.txt", format="bytes") == "héllo\n".encode()
    assert b"".join(shared.files.read(f"{d}/hello.txt", format="stream")) == "héllo\n".encode()
    # what a command sees
    assert shared.commands.run(f"cat {d}/hello.txt").stdout == "héllo\n"


def test_write_several_files_at_once(shared: Sandbox, d: str) -> None:
    entries = shared.files.write([
        {"path": f"{d}/a.txt", "data": "A"},
        {"path": f"{d}/sub/b.bin", "data": b"\x00\x01", "mode": 0o600},
    ])
    assert [e.path for e in entries] == [f"{d}/a.txt", f"{d}/sub/b.bin"]
    assert entries[1].mode == "0600"
    assert shared.files.read(f"{d}/sub/b.bin", format="bytes") == b"\x00\x01"
    with pytest.raises(TypeError, match="unknown entry keys"):
        shared.files.write([{"path": f"{d}/c.txt", "data": "C", "colour": "red"}])
    assert not shared.files.exists(f"{d}/c.txt")


def test_write_binary_modes_owners_and_parents(shared: Sandbox, d: str) -> None:
    blob = bytes(range(256)) * 64
    assert shared.files.write(f"{d}/a/b/c.bin", blob).size == len(blob)
    assert shared.files.read(f"{d}/a/b/c.bin", format="bytes") == blob
    assert shared.files.stat(f"{d}/a/b").is_dir  # parents made
    script = shared.files.write(f"{d}/run.sh", "#!/bin/sh\necho ran\n", mode=0o755)
    assert script.mode == "0755" and script.permissions == 0o755
    assert shared.commands.run(f"{d}/run.sh").stdout == "ran\n"
    owned = shared.files.write(f"{d}/root.txt", "r", user="root", mode="600")
    assert (owned.uid, owned.gid, owned.mode) == (0, 0, "0600")
    assert shared.commands.run(f"cat {d}/root.txt").exit_code != 0  # user may not read it
    # a binary file object, streamed up
    up = shared.files.write(f"{d}/from-file.bin", io.BytesIO(blob))
    assert up.size == len(blob)
    # an existing file is replaced
    shared.files.write(f"{d}/run.sh", "new")
    assert shared.files.read(f"{d}/run.sh") == "new"


def test_large_file_round_trip(shared: Sandbox, d: str) -> None:
    """10 MiB up and down again, checked by SHA-256 on both ends."""
    blob = os.urandom(10 * 1024 * 1024)
    digest = hashlib.sha256(blob).hexdigest()
    shared.files.write(f"{d}/big.bin", blob)
    assert shared.commands.run(f"sha256sum {d}/big.bin").stdout.split()[0] == digest
    assert hashlib.sha256(shared.files.read(f"{d}/big.bin", format="bytes")).hexdigest() == digest
    streamed = hashlib.sha256()
    for chunk in shared.files.read(f"{d}/big.bin", format="stream"):
        streamed.update(chunk)
    assert streamed.hexdigest() == digest
    # From a file object, streamed up in chunks.
    shared.files.write(f"{d}/big2.bin", io.BytesIO(blob))
    assert shared.commands.run(f"sha256sum {d}/big2.bin").stdout.split()[0] == digest


def test_read_and_write_errors(shared: Sandbox, d: str) -> None:
    with pytest.raises(NotFoundError) as ei:
        shared.files.read(f"{d}/missing.txt")
    assert ei.value.status == 404 and "missing.txt" in ei.value.message
    with pytest.raises(NotFoundError):
        list(shared.files.read(f"{d}/missing.txt", format="stream"))
    with pytest.raises(ConflictError):
        shared.files.read(d)  # a directory
    with pytest.raises(InvalidRequestError) as ei2:
        shared.files.read("relative.txt")
    assert ei2.value.field == "path"
    with pytest.raises(InvalidRequestError):
        shared.files.read("/proc/1/environ")
    with pytest.raises(ValueError):
        shared.files.read(f"{d}/x", format="yaml")
    with pytest.raises(ConflictError):
        shared.files.write(d, "a directory is in the way")
    shared.files.write(f"{d}/plain", "a file")
    with pytest.raises(ConflictError):
        shared.files.write(f"{d}/plain/child", "a file is in the way")
    with pytest.raises(InvalidRequestError):
        shared.files.write("/sys/x", "refused")
    with pytest.raises(InvalidRequestError):
        shared.files.write(f"{d}/m", "x", mode="999")


def test_list(shared: Sandbox, d: str) -> None:
    shared.files.write(f"{d}/b.txt", "b")
    shared.files.write(f"{d}/a.txt", "a")
    shared.files.write(f"{d}/sub/c.txt", "c")
    shared.files.write(f"{d}/.hidden", "h")
    top = shared.files.list(d)
    assert isinstance(top, EntryList) and not top.truncated
    assert [e.name for e in top] == [".hidden", "a.txt", "b.txt", "sub"]
    assert [e.type for e in top] == ["file", "file", "file", "dir"]
    deep = shared.files.list(d, recursive=True)
    assert [e.path for e in deep] == [f"{d}/.hidden", f"{d}/a.txt", f"{d}/b.txt", f"{d}/sub", f"{d}/sub/c.txt"]
    cut = shared.files.list(d, recursive=True, limit=2)
    assert len(cut) == 2 and cut.truncated


def test_list_errors(shared: Sandbox, d: str) -> None:
    with pytest.raises(NotFoundError):
        shared.files.list(f"{d}/nope")
    shared.files.write(f"{d}/f", "f")
    with pytest.raises(ConflictError):
        shared.files.list(f"{d}/f")
    with pytest.raises(InvalidRequestError) as ei:
        shared.files.list(d, limit=0)
    assert ei.value.field == "limit"


def test_stat_and_exists(shared: Sandbox, d: str) -> None:
    shared.files.write(f"{d}/f.txt", "12345")
    st = shared.files.stat(f"{d}/f.txt")
    assert (st.type, st.size, st.name) == ("file", 5, "f.txt") and st.modified_at is not None
    assert shared.files.get_info(d).is_dir
    shared.commands.run(f"ln -s f.txt {d}/link")
    link = shared.files.stat(f"{d}/link")
    assert link.is_symlink and link.symlink_target == "f.txt"
    assert shared.files.exists(f"{d}/f.txt") and shared.files.exists(d)
    assert not shared.files.exists(f"{d}/missing")
    with pytest.raises(NotFoundError):
        shared.files.stat(f"{d}/missing")
    with pytest.raises(InvalidRequestError):
        shared.files.stat("not/absolute")
    with pytest.raises(InvalidRequestError):
        shared.files.exists("/proc/self")  # refused, not "missing"


def test_remove(shared: Sandbox, d: str) -> None:
    shared.files.write(f"{d}/f", "x")
    assert shared.files.remove(f"{d}/f") is None
    assert not shared.files.exists(f"{d}/f")
    shared.files.write(f"{d}/tree/a/b", "x")
    with pytest.raises(ConflictError):
        shared.files.remove(f"{d}/tree")  # not empty
    shared.files.remove(f"{d}/tree", recursive=True)
    assert not shared.files.exists(f"{d}/tree")
    with pytest.raises(NotFoundError):
        shared.files.remove(f"{d}/tree")
    with pytest.raises(InvalidRequestError):
        shared.files.remove("/", recursive=True)


def test_make_dir(shared: Sandbox, d: str) -> None:
    entry = shared.files.make_dir(f"{d}/x/y/z")
    assert entry.is_dir and entry.path == f"{d}/x/y/z" and entry.uid == 1000
    assert shared.files.make_dir(f"{d}/x/y/z").is_dir  # existing: fine
    shared.files.write(f"{d}/file", "x")
    with pytest.raises(ConflictError):
        shared.files.make_dir(f"{d}/file")
    with pytest.raises(ConflictError):
        shared.files.make_dir(f"{d}/file/below")
    with pytest.raises(InvalidRequestError):
        shared.files.make_dir("relative")


def test_rename(shared: Sandbox, d: str) -> None:
    shared.files.write(f"{d}/a.txt", "A")
    entry = shared.files.rename(f"{d}/a.txt", f"{d}/b.txt")
    assert entry.path == f"{d}/b.txt" and entry.size == 1
    assert not shared.files.exists(f"{d}/a.txt") and shared.files.read(f"{d}/b.txt") == "A"
    shared.files.write(f"{d}/c.txt", "C")
    shared.files.move(f"{d}/c.txt", f"{d}/b.txt")  # replaces
    assert shared.files.read(f"{d}/b.txt") == "C"
    with pytest.raises(NotFoundError):
        shared.files.rename(f"{d}/missing", f"{d}/other")
    with pytest.raises(NotFoundError):
        shared.files.rename(f"{d}/b.txt", f"{d}/no/parent/b.txt")
    shared.files.write(f"{d}/full/f", "x")
    shared.files.make_dir(f"{d}/dir2")
    with pytest.raises(ConflictError):
        shared.files.rename(f"{d}/dir2", f"{d}/full")  # a directory that is not empty
    with pytest.raises(ConflictError):
        shared.files.rename(f"{d}/b.txt", "/dev/shm/b.txt")  # across file systems


def _collect(w: WatchHandle, until) -> list:
    seen = []
    for ev in w:
        seen.append(ev)
        if until(seen):
            break
    return seen


def test_watch(shared: Sandbox, d: str) -> None:
    with shared.files.watch(d, timeout=10) as w:
        shared.files.make_dir(f"{d}/newdir")
        shared.commands.run(f"echo hi > {d}/f.txt && mv {d}/f.txt {d}/g.txt && rm {d}/g.txt")
        seen = _collect(w, lambda s: any(e.type == "delete" and e.path.endswith("g.txt") for e in s))
    assert w.closed
    assert all(isinstance(e, FilesystemEvent) for e in seen)
    kinds = [(e.type, e.path) for e in seen]
    assert ("create", f"{d}/newdir") in kinds
    assert ("create", f"{d}/f.txt") in kinds and ("modify", f"{d}/f.txt") in kinds
    assert ("delete", f"{d}/g.txt") in kinds
    assert next(e for e in seen if e.path == f"{d}/newdir").is_dir
    rename = next(e for e in seen if e.type == "rename")
    assert (rename.from_path, rename.path) == (f"{d}/f.txt", f"{d}/g.txt")


def test_watch_recursive_and_timeout(shared: Sandbox, d: str) -> None:
    shared.files.make_dir(f"{d}/deep/er")
    w = shared.files.watch(d, recursive=True, timeout=2)
    try:
        shared.commands.run(f"touch {d}/deep/er/leaf")
        seen = list(w)  # ends by itself: nothing happens for 2 s after the events
    finally:
        w.close()
    assert ("create", f"{d}/deep/er/leaf") in [(e.type, e.path) for e in seen]
    # without recursive, changes below the directory are not seen
    with shared.files.watch(d, timeout=1.5) as flat:
        shared.commands.run(f"touch {d}/deep/er/leaf2")
        assert list(flat) == []


def test_watch_errors(shared: Sandbox, d: str) -> None:
    with pytest.raises(NotFoundError):
        shared.files.watch(f"{d}/missing")
    shared.files.write(f"{d}/file", "x")
    with pytest.raises(ConflictError):
        shared.files.watch(f"{d}/file")
    with pytest.raises(InvalidRequestError):
        shared.files.watch("/proc")


def test_files_on_paused_sandbox(sandbox: Sandbox) -> None:
    sandbox.files.write("/home/user/f", "x")
    sandbox.pause()
    calls = [
        lambda: sandbox.files.read("/home/user/f"),
        lambda: sandbox.files.write("/home/user/g", "y"),
        lambda: sandbox.files.list("/home/user"),
        lambda: sandbox.files.stat("/home/user/f"),
        lambda: sandbox.files.exists("/home/user/f"),
        lambda: sandbox.files.remove("/home/user/f"),
        lambda: sandbox.files.make_dir("/home/user/d"),
        lambda: sandbox.files.rename("/home/user/f", "/home/user/h"),
        lambda: sandbox.files.watch("/home/user"),
    ]
    for call in calls:
        with pytest.raises(SandboxNotRunningError):
            call()
    assert sandbox.refresh().state == "paused"
