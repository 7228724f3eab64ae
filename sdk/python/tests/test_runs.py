"""One-shot runs and their artifacts: run, download, list, delete; sync and async."""

from __future__ import annotations

import asyncio

import pytest

from conftest import SIZE, Server

from cella import (
    Artifact,
    ArtifactInfo,
    AsyncArtifact,
    AsyncSandbox,
    CommandExitError,
    InvalidRequestError,
    NotFoundError,
    RunResult,
    Sandbox,
)


def test_run_with_files_and_artifacts(server: Server, tag: str) -> None:
    r = Sandbox.run(
        "mkdir -p out && sort in.csv > out/sorted.csv && cp bin.dat out/ && wc -l < in.csv && echo $MODE >&2",
        files={"in.csv": "b,2\na,1\n", "bin.dat": bytes(range(256))},
        artifacts=["out/*"],
        env={"MODE": "test"},
        size=SIZE,
        timeout=60,
        metadata={"test": tag},
    )
    assert isinstance(r, RunResult) and r.ok
    assert r.exit_code == 0 and not r.timed_out and r.duration_ms >= 0
    assert r.stdout == "2\n" and r.stderr == "test\n"
    assert r.sandbox_id.startswith("sb")
    assert Sandbox.connect(r.sandbox_id).state == "destroyed"
    by_name = {a.name: a for a in r.artifacts}
    assert set(by_name) == {"sorted.csv", "bin.dat"}
    art = by_name["sorted.csv"]
    assert isinstance(art, ArtifactInfo) and art.id.startswith("art")
    assert art.path == "/home/user/out/sorted.csv" and art.size == 8 and art.sandbox_id == r.sandbox_id
    assert art.url.endswith("/api/v1/artifacts/" + art.id)
    assert art.created_at is not None and art.expires_at is not None and art.expires_at > art.created_at
    # the artifacts outlive the run's sandbox
    assert Artifact.download(art) == b"a,1\nb,2\n"
    assert Artifact.download(by_name["bin.dat"].id) == bytes(range(256))
    assert b"".join(Artifact.download_stream(art.id)) == b"a,1\nb,2\n"
    assert {a.id for a in Artifact.list(sandbox_id=r.sandbox_id)} == {a.id for a in r.artifacts}
    for a in r.artifacts:
        assert Artifact.delete(a).id == a.id
    with pytest.raises(NotFoundError):
        Artifact.download(art)
    assert Artifact.list(sandbox_id=r.sandbox_id) == []


def test_run_argv_exit_code_and_check(server: Server) -> None:
    r = Sandbox.run(["sh", "-c", "echo oops >&2; exit 3"], size=SIZE)
    assert r.exit_code == 3 and not r.ok and r.stderr == "oops\n" and r.artifacts == []
    with pytest.raises(CommandExitError) as exc:
        Sandbox.run("exit 4", size=SIZE, check=True)
    assert exc.value.exit_code == 4


def test_run_errors(server: Server) -> None:
    with pytest.raises(InvalidRequestError) as exc:
        Sandbox.run(files={"a.txt": "x"})  # no command
    assert exc.value.status == 400 and exc.value.field == "command"
    with pytest.raises(InvalidRequestError):
        Sandbox.run([])  # an empty argv
    with pytest.raises(NotFoundError):
        Artifact.download("art000000000000000000")
    with pytest.raises(NotFoundError):
        Artifact.delete("art000000000000000000")


def test_collect_artifacts_from_a_running_sandbox(server: Server, sandbox: Sandbox) -> None:
    sandbox.files.write("/home/user/res/a.json", '{"a": 1}')
    arts = sandbox.collect_artifacts(["res/*.json", "res/none-*"])
    assert [a.path for a in arts] == ["/home/user/res/a.json"]
    assert Artifact.download(arts[0]) == b'{"a": 1}'
    Artifact.delete(arts[0])
    with pytest.raises(InvalidRequestError):
        sandbox.collect_artifacts([])


def test_async_run_and_download(server: Server) -> None:
    async def main() -> None:
        r = await AsyncSandbox.run("mkdir -p out && echo hi > out/hi.txt", artifacts=["out/hi.txt"], size=SIZE)
        assert r.ok and [a.name for a in r.artifacts] == ["hi.txt"]
        assert await AsyncArtifact.download(r.artifacts[0]) == b"hi\n"
        chunks = [c async for c in AsyncArtifact.download_stream(r.artifacts[0].id)]
        assert b"".join(chunks) == b"hi\n"
        assert [a.id for a in await AsyncArtifact.list(sandbox_id=r.sandbox_id)] == [r.artifacts[0].id]
        await AsyncArtifact.delete(r.artifacts[0])
        with pytest.raises(NotFoundError):
            await AsyncArtifact.download(r.artifacts[0])
        with pytest.raises(InvalidRequestError):
            await AsyncSandbox.run()

    asyncio.run(main())
