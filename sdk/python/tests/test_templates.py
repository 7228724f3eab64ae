"""Custom templates: build, follow the log, create a sandbox from one, delete; a failing
build; sync and async."""

from __future__ import annotations

import asyncio
import uuid
from typing import List

import pytest

from conftest import SIZE, Server

from cella import (
    AsyncSandbox,
    AsyncTemplate,
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    Sandbox,
    Template,
    TemplateBuild,
    TemplateBuildError,
    TemplateBuildHandle,
)


def template_id() -> str:
    return "sdk-tpl-" + uuid.uuid4().hex[:10]


def test_build_use_and_delete_a_template(server: Server) -> None:
    tid = template_id()
    pieces: List[str] = []
    with Template.build({"id": tid, "steps": [{"run": "echo hi > /opt/hi.txt"}]}) as handle:
        assert isinstance(handle, TemplateBuildHandle)
        assert handle.id.startswith("bld") and handle.template_id == tid
        assert handle.state in ("queued", "building", "ready")
        build = handle.wait(on_log=pieces.append, timeout=120, check=True)
    try:
        assert isinstance(build, TemplateBuild) and build.state == "ready" and build.ok
        assert build.error is None and build.finished_at is not None
        assert [(s.index, s.kind) for s in build.steps] == [(0, "run")] and build.steps[0].state in ("done", "cached")
        assert "".join(pieces) == build.log and f"template {tid} is ready" in build.log
        assert Template.get_build(tid, build.id).state == "ready"
        assert [b.id for b in Template.builds(tid)] == [build.id]
        assert tid in [t.id for t in Template.list()]
        assert Template.get(tid).id == tid
        with Sandbox.create(template=tid, size=SIZE, timeout=300) as sb:
            assert sb.info.template_id == tid
            assert sb.files.read("/opt/hi.txt") == "hi\n"
            # a template in use cannot be deleted
            with pytest.raises(ConflictError):
                Template.delete(tid)
    finally:
        deleted = Template.delete(tid)
    assert deleted.id == tid
    with pytest.raises(NotFoundError):
        Template.get(tid)
    with pytest.raises(NotFoundError):
        Template.get_build(tid, build.id)


def test_failing_build(server: Server) -> None:
    tid = template_id()
    handle = Template.build({"id": tid, "steps": [{"run": "echo going-wrong; exit 3"}]})
    try:
        build = handle.wait(timeout=120)
        assert build.state == "failed" and not build.ok
        assert "exited with 3" in (build.error or "")
        assert "going-wrong" in build.log and "build failed" in build.log
        assert build.steps[0].state == "failed"
        with pytest.raises(TemplateBuildError) as exc:
            handle.wait(check=True)
        assert exc.value.build.id == build.id and exc.value.code == "BUILD_FAILED"
    finally:
        handle.close()
        Template.delete(tid)


def test_template_errors(server: Server) -> None:
    with pytest.raises(InvalidRequestError) as exc:
        Template.build({"id": "Not Valid", "steps": []})
    assert exc.value.status == 400
    with pytest.raises(InvalidRequestError):
        Template.build({"id": template_id(), "steps": [{"bogus": "x"}]})
    with pytest.raises(ConflictError):
        Template.delete("base")
    with pytest.raises(NotFoundError):
        Template.delete(template_id())


def test_async_build(server: Server) -> None:
    async def main() -> None:
        tid = template_id()
        got: List[str] = []

        async def on_log(text: str) -> None:
            got.append(text)

        async with await AsyncTemplate.build({"id": tid, "steps": [{"run": "echo async > /opt/a.txt"}]}) as handle:
            build = await handle.wait(on_log, timeout=120, check=True)
        try:
            assert build.state == "ready" and "".join(got) == build.log
            async with AsyncSandbox.create(template=tid, size=SIZE) as sb:
                assert await sb.files.read("/opt/a.txt") == "async\n"
        finally:
            assert (await AsyncTemplate.delete(tid)).id == tid
        with pytest.raises(NotFoundError):
            await AsyncTemplate.get(tid)

    asyncio.run(main())
