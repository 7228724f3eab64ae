"""Task runs against a local repository: a server of its own with a `git` forge over a
temporary directory of bare repositories and a command agent that edits a file and commits (no
model needed). The run is started, followed to its end, and its branch looked at in the
repository."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import tempfile
import threading
import time
from decimal import Decimal
from pathlib import Path
from typing import Dict, Iterator, List

import pytest

from conftest import Server, start_server, stop_server

from cella import (
    AsyncTask,
    AsyncWorkspace,
    GoneError,
    NotFoundError,
    PermissionDeniedError,
    Task,
    TaskEvent,
    TaskInfo,
    TaskLogChunk,
    Workspace,
)

GIT = ["git", "-c", "user.name=test", "-c", "user.email=test@example.org", "-c", "init.defaultBranch=main"]
GIT_ID = "git -c user.name=agent -c user.email=agent@example.org"
AGENT = (
    "echo 'hello from the agent' > hello.txt && " + GIT_ID + " add -A && "
    + GIT_ID + " commit -qm 'Say hello' && echo agent done: $CELLA_TASK"
)


def make_repo(root: Path, name: str) -> Path:
    """A bare repository at root/name.git with one commit on main (README.md)."""
    work = Path(tempfile.mkdtemp(prefix="cella-sdk-repo-"))
    try:
        subprocess.run(GIT + ["init", "-q", str(work)], check=True)
        (work / "README.md").write_text("# web\n")
        subprocess.run(GIT + ["-C", str(work), "add", "-A"], check=True)
        subprocess.run(GIT + ["-C", str(work), "commit", "-qm", "Initial commit"], check=True)
        bare = root / f"{name}.git"
        bare.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(GIT + ["clone", "-q", "--bare", str(work), str(bare)], check=True)
        return bare
    finally:
        shutil.rmtree(work, ignore_errors=True)


def git_out(bare: Path, *args: str) -> str:
    return subprocess.run(["git", "--git-dir", str(bare), *args], check=True, capture_output=True, text=True).stdout


@pytest.fixture(scope="module")
def repos() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="cella-sdk-repos-"))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def bare(repos: Path) -> Path:
    return make_repo(repos, "acme/web")


@pytest.fixture(scope="module")
def tasks_server(repos: Path, bare: Path) -> Iterator[Server]:
    config = (
        "[tasks]\nrunners = 1\nheartbeat_interval_sec = 1\ngrace_sec = 2\n\n"
        f'[[forges]]\nname = "local"\nkind = "git"\nurl_template = "{repos}/{{repository}}.git"\n\n'
        f"[[agents]]\nname = \"script\"\nkind = \"command\"\ncommand = [\"bash\", \"-c\", '''{AGENT}''']\n"
    )
    srv = start_server(config, name="cella-tasks")
    try:
        yield srv
    finally:
        left = stop_server(srv)
        assert not left, f"the tests left sandboxes behind: {left}"


@pytest.fixture(scope="module")
def conn(tasks_server: Server) -> Dict[str, str]:
    return {"server": tasks_server.url, "api_key": tasks_server.api_key}


def assert_disabled(conn: Dict[str, str]) -> None:
    with pytest.raises(PermissionDeniedError) as exc:
        Task.start("acme/web", "say hello", **conn)
    assert exc.value.status == 403
    assert exc.value.details["reason"] == "tasks_disabled"
    assert Task.list(**conn) == []  # nothing was queued


def test_disabled_task_runs_are_a_typed_403(conn: Dict[str, str]) -> None:
    assert_disabled(conn)


@pytest.fixture(scope="module")
def enabled(conn: Dict[str, str]) -> str:
    """Task runs on, a compute rate, and credit to cover a run: the workspace's id."""
    assert_disabled(conn)  # before they are turned on, whichever tests -k picks
    ws = Workspace.get(**conn)
    assert not ws.tasks_enabled
    ws = Workspace.update(ws.id, settings={"tasks_enabled": True, "compute_rate": "0.001000", "session_limit_min": 5}, **conn)
    assert ws.tasks_enabled and ws.settings["compute_rate"] == "0.001000"
    entry = Workspace.add_credits(ws.id, "20", "sdk test credit", **conn)
    assert entry.kind == "credit" and entry.amount == Decimal("20")
    return ws.id


def test_task_run_against_a_local_repository(conn: Dict[str, str], enabled: str, bare: Path) -> None:
    run = Task.start("acme/web", "greet", agent="script", metadata={"ticket": "SDK-1"}, **conn)
    assert isinstance(run, TaskInfo)
    assert run.state == "queued" and run.repository == "acme/web" and run.base_branch == "main"
    assert run.metadata == {"ticket": "SDK-1"} and run.forge == "local" and run.agent == "script"

    # The live log, read beside the events while the run is alive.
    chunks: List[TaskLogChunk] = []
    reader = threading.Thread(target=lambda: chunks.extend(Task.log(run, **conn)), daemon=True)
    reader.start()

    events: List[TaskEvent] = list(Task.events(run.id, timeout=300, **conn))
    states = [e.state for e in events if e.event == "state"]
    assert states[-1] == "stopped", events
    assert events[-1].finished and events[-1].stop_reason == "agent_exit"
    assert set(states) <= {"queued", "provisioning", "running", "stopped"}, states
    reader.join(60)
    assert not reader.is_alive()
    assert "agent done: greet" in "".join(c.text for c in chunks), chunks

    ended = Task.get(run.id, **conn)
    assert ended.state == "stopped" and ended.finished and ended.ok
    assert ended.failure_reason is None and ended.pull_request is None  # a git forge opens none
    assert ended.ended_at is not None and ended.compute_rate == Decimal("0.001000")
    assert ended.branch == f"cella/{run.id}"
    # The branch is in the repository, with the agent's commit on top of main.
    assert git_out(bare, "show", f"{ended.branch}:hello.txt") == "hello from the agent\n"
    assert git_out(bare, "log", "-1", "--format=%s", ended.branch).strip() == "Say hello"
    assert git_out(bare, "rev-parse", f"{ended.branch}~1") == git_out(bare, "rev-parse", "main")

    # Listed, filtered; events of an ended run: its state, then the end.
    assert [t.id for t in Task.list(**conn)][:1] == [run.id]
    assert run.id in [t.id for t in Task.list(state="stopped", repository="acme/web", **conn)]
    assert Task.list(state="running", **conn) == []
    again = list(Task.events(run, **conn))
    assert again[-1].state == "stopped"
    # The log is never kept: 410 once the run has ended.
    with pytest.raises(GoneError) as gone:
        list(Task.log(run.id, **conn))
    assert gone.value.status == 410
    # Cancelling an ended run is idempotent: the run unchanged.
    assert Task.cancel(run.id, **conn).state == "stopped"

    # Charged once, as a compute entry of the run, at least the 60-second minimum.
    deadline = time.monotonic() + 60
    while True:
        compute = [e for e in Workspace.ledger(enabled, **conn) if e.task_id == run.id and e.kind == "compute"]
        if compute or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert len(compute) == 1, compute
    assert compute[0].amount == -Task.get(run.id, **conn).compute_cost <= Decimal("-0.060000")
    usage = Workspace.usage(enabled, **conn)
    assert usage.totals.compute_sec >= 60 and usage.totals.compute_cost > 0


def test_cancel_a_run(conn: Dict[str, str], enabled: str, bare: Path) -> None:
    run = Task.start("acme/web", "cancelled before it starts", agent="script", **conn)
    cancelled = Task.cancel(run, **conn)
    assert cancelled.id == run.id
    seen: List[TaskEvent] = []
    ended = Task.wait(run, timeout=300, on_event=seen.append, **conn)
    assert ended.state == "cancelled" and ended.stop_reason == "cancelled", ended
    assert seen and seen[-1].state == "cancelled"
    assert Task.cancel(run, **conn).state == "cancelled"  # idempotent


def test_task_errors(conn: Dict[str, str], enabled: str) -> None:
    with pytest.raises(NotFoundError):
        Task.get("task00000000000000000", **conn)
    with pytest.raises(NotFoundError):
        Task.start("acme/nothere", "x", **conn)
    with pytest.raises(NotFoundError):
        Task.start("acme/web", "x", base_branch="nope", **conn)
    with pytest.raises(Exception) as bad:
        Task.start("acme/web", "x", agent="nope", **conn)
    assert bad.value.field == "agent"


def test_async_task_runs(conn: Dict[str, str], enabled: str, bare: Path) -> None:
    async def main() -> None:
        run = await AsyncTask.start("acme/web", "greet again", agent="script", **conn)
        assert run.state == "queued"
        events = [e async for e in AsyncTask.events(run.id, timeout=300, **conn)]
        assert events[-1].state == "stopped", events
        ended = await AsyncTask.get(run, **conn)
        assert ended.state == "stopped"
        assert run.id in [t.id for t in await AsyncTask.list(repository="acme/web", **conn)]
        assert (await AsyncTask.cancel(run, **conn)).state == "stopped"
        assert (await AsyncTask.wait(run, **conn)).state == "stopped"
        with pytest.raises(GoneError):
            async for _ in AsyncTask.log(run, **conn):
                pass
        wallet = await AsyncWorkspace.wallet(**conn)
        assert wallet.balance <= Decimal("20") and wallet.currency == "USD"
        assert git_out(bare, "show", f"{ended.branch}:hello.txt") == "hello from the agent\n"

    asyncio.run(main())
