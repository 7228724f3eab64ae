"""Commands: run (plain and streamed), background processes and their handles."""

from __future__ import annotations

import signal
import time

import pytest



from cella import (
    CellaTimeoutError,
    CommandExitError,
    CommandHandle,
    CommandResult,
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    OutputChunk,
    ProcessInfo,
    Sandbox,
    SandboxNotRunningError,
)

# --------------------------------------------------------------------------- run


def test_run(shared: Sandbox) -> None:
    r = shared.commands.run("echo out; echo err >&2; exit 3")
    assert isinstance(r, CommandResult)
    assert (r.exit_code, r.stdout, r.stderr) == (3, "out\n", "err\n")
    assert not r.ok and not r.timed_out and r.duration_ms >= 0
    assert not r.stdout_truncated and not r.stderr_truncated
    assert shared.commands.run("true").ok


def test_run_argv_env_cwd_user_stdin(shared: Sandbox) -> None:
    r = shared.commands.run(["printf", "%s|", "a b", "$HOME"])
    assert r.stdout == "a b|$HOME|"  # no shell: nothing expanded
    assert shared.commands.run("echo $A-$B", env={"A": "1", "B": "two"}).stdout == "1-two\n"
    assert shared.commands.run("pwd", cwd="/tmp").stdout == "/tmp\n"
    assert shared.commands.run("id -u").stdout == "1000\n"
    assert shared.commands.run("id -u", user="root").stdout == "0\n"
    assert shared.commands.run("tr a-z A-Z", stdin="shout\n").stdout == "SHOUT\n"
    assert shared.commands.run(["cat"], stdin=b"bytes in").stdout == "bytes in"


def test_run_timeout(shared: Sandbox) -> None:
    r = shared.commands.run("echo started; sleep 30", timeout=1)
    assert r.timed_out and r.exit_code == 137 and r.stdout == "started\n"
    assert 900 <= r.duration_ms < 10_000


def test_run_check(shared: Sandbox) -> None:
    assert shared.commands.run("echo fine", check=True).stdout == "fine\n"
    with pytest.raises(CommandExitError) as ei:
        shared.commands.run("echo bad >&2; exit 4", check=True)
    assert ei.value.exit_code == 4 and ei.value.result.stderr == "bad\n" and "bad" in str(ei.value)


def test_run_errors(shared: Sandbox) -> None:
    with pytest.raises(InvalidRequestError) as ei:
        shared.commands.run("true", cwd="relative/dir")
    assert ei.value.field == "cwd" and ei.value.status == 400
    with pytest.raises(InvalidRequestError) as ei:
        shared.commands.run("true", cwd="/no/such/dir")
    assert ei.value.field == "cwd"
    with pytest.raises(InvalidRequestError) as ei:
        shared.commands.run("true", timeout=0)
    assert ei.value.field == "timeout_sec"
    with pytest.raises(InvalidRequestError):
        shared.commands.run("true", user="nobody")
    with pytest.raises(InvalidRequestError):
        shared.commands.run([])
    with pytest.raises(TypeError):
        shared.commands.run(42)  # type: ignore[arg-type]
    r = shared.commands.run(["no-such-program"])
    assert r.exit_code == 127 and "not found" in r.stderr


def test_run_on_paused_sandbox(sandbox: Sandbox) -> None:
    sandbox.pause()
    for kwargs in ({}, {"on_stdout": print}):
        with pytest.raises(SandboxNotRunningError) as ei:
            sandbox.commands.run("true", **kwargs)
        assert ei.value.status == 409
    assert sandbox.refresh().state == "paused"  # not woken


# --------------------------------------------------------------------------- streamed run


def test_run_streams_to_callbacks(shared: Sandbox) -> None:
    events = []
    stamps = []

    def on_stdout(text: str) -> None:
        events.append(("out", text))
        stamps.append(time.monotonic())

    r = shared.commands.run(
        "for i in 1 2 3; do echo line$i; sleep 0.3; done; echo oops >&2; exit 5",
        on_stdout=on_stdout,
        on_stderr=lambda t: events.append(("err", t)),
    )
    assert r.exit_code == 5 and r.stdout == "line1\nline2\nline3\n" and r.stderr == "oops\n"
    assert "".join(t for k, t in events if k == "out") == r.stdout
    assert events[-1] == ("err", "oops\n")
    # the pieces came while the command ran, not all at the end
    assert stamps[-1] - stamps[0] >= 0.4


def test_run_streamed_binary_and_only_stderr_callback(shared: Sandbox) -> None:
    seen = []
    r = shared.commands.run("printf 'ok\\n'; printf '\\377\\376' >&2", on_stderr=seen.append)
    assert r.stdout == "ok\n"
    assert r.stderr == "\ufffd\ufffd"  # bytes that are not UTF-8 come as base64, decoded
    assert seen == ["\ufffd\ufffd"]


def test_run_streamed_options_and_errors(shared: Sandbox) -> None:
    out = []
    r = shared.commands.run(["sh", "-c", "echo $X; pwd; cat"], env={"X": "x!"}, cwd="/tmp", stdin="in", user="root",
                            on_stdout=out.append)
    assert r.stdout == "x!\n/tmp\nin" and "".join(out) == r.stdout
    r = shared.commands.run("sleep 30", timeout=1, on_stdout=out.append)
    assert r.timed_out and r.exit_code == 137
    # an error found before the stream starts is an error answer...
    with pytest.raises(InvalidRequestError) as ei:
        shared.commands.run("true", cwd="relative", on_stdout=print)
    assert ei.value.field == "cwd" and ei.value.status == 400
    # ...one found once it started comes as the stream's `error` event
    with pytest.raises(InvalidRequestError) as ei:
        shared.commands.run("true", cwd="/no/such/dir", on_stdout=print)
    assert ei.value.field == "cwd" and ei.value.request_id
    with pytest.raises(CommandExitError):
        shared.commands.run("exit 1", on_stdout=print, check=True)


# --------------------------------------------------------------------------- background processes


def test_start_wait_and_iterate(shared: Sandbox) -> None:
    h = shared.commands.start("for i in 1 2 3; do echo n$i; sleep 0.2; done; echo e >&2; exit 7", tag="counter")
    assert isinstance(h, CommandHandle) and h.pid > 1 and h.tag == "counter"
    assert h.info.state == "running" and h.exit_code is None
    assert h.info.argv == ["/bin/bash", "-c", "for i in 1 2 3; do echo n$i; sleep 0.2; done; echo e >&2; exit 7"]
    chunks = list(h)
    assert all(isinstance(c, OutputChunk) for c in chunks)
    assert "".join(c.text for c in chunks if c.stream == "stdout") == "n1\nn2\nn3\n"
    assert [c.text for c in chunks if c.stream == "stderr"] == ["e\n"]
    assert h.exit_code == 7
    # wait on an exited process answers at once, with its buffered output
    outs = []
    r = h.wait(on_stdout=outs.append)
    assert (r.exit_code, r.stdout, r.stderr) == (7, "n1\nn2\nn3\n", "e\n") and "".join(outs) == r.stdout
    with pytest.raises(CommandExitError):
        h.wait(check=True)
    info = h.refresh()
    assert info.state == "exited" and info.exit_code == 7 and info.ended_at is not None


def test_start_options(shared: Sandbox) -> None:
    h = shared.commands.start(["sh", "-c", "echo $V; pwd; id -u"], env={"V": "v"}, cwd="/tmp", user="root")
    r = h.wait(timeout=30)
    assert r.stdout == "v\n/tmp\n0\n" and r.exit_code == 0
    assert h.info.user == "root" and h.info.cwd == "/tmp"
    h2 = shared.commands.run("echo bg", background=True)
    assert isinstance(h2, CommandHandle) and h2.wait().stdout == "bg\n"


def test_output_from_now(shared: Sandbox) -> None:
    h = shared.commands.start("echo early; sleep 1; echo late")
    first = h.output()
    assert next(first).text == "early\n"
    first.close()
    text = "".join(c.text for c in h.output(from_start=False))
    assert text == "late\n"
    assert h.exit_code == 0


def test_stdin(shared: Sandbox) -> None:
    h = shared.commands.start("cat")
    info = h.send_stdin("hello ")
    assert isinstance(info, ProcessInfo) and info.state == "running"
    h.send_stdin(b"world")
    h.close_stdin()
    assert h.wait(timeout=30).stdout == "hello world"
    with pytest.raises(ConflictError):
        h.send_stdin("too late")
    h2 = shared.commands.run("wc -c", background=True, stdin="12345")
    assert h2.wait(timeout=30).stdout.strip() == "5"


def test_kill_and_signal(shared: Sandbox) -> None:
    h = shared.commands.start("sleep 1000")
    assert h.kill() is True
    r = h.wait(timeout=30)
    assert r.exit_code == 137  # 128 + SIGKILL
    assert h.kill() is False  # it had exited
    with pytest.raises(ConflictError):
        h.signal("TERM")
    h = shared.commands.start("sleep 1000")
    assert h.signal(signal.SIGTERM).pid == h.pid
    assert h.wait(timeout=30).exit_code == 128 + signal.SIGTERM
    h = shared.commands.start("trap 'echo got usr1; exit 0' USR1; echo ready; while true; do sleep 0.05; done")
    out = h.output()
    assert next(out).text == "ready\n"  # the trap is set
    out.close()
    h.signal("usr1")
    assert h.wait(timeout=30).stdout == "ready\ngot usr1\n"
    # a process that ignores SIGTERM: signalled by number, it keeps running
    h = shared.commands.start("trap '' TERM; echo ready; sleep 1000")
    out = h.output()
    assert next(out).text == "ready\n"  # the trap is set
    out.close()
    try:
        with pytest.raises(InvalidRequestError) as ei:
            h.signal("NOT_A_SIGNAL")
        assert ei.value.field == "signal"
        assert h.signal(15).state == "running"
        time.sleep(0.2)
        assert h.refresh().state == "running"
    finally:
        assert h.kill() is True


def test_wait_timeout(shared: Sandbox) -> None:
    h = shared.commands.start("sleep 1000")
    try:
        t0 = time.monotonic()
        with pytest.raises(CellaTimeoutError):
            h.wait(timeout=1)
        assert time.monotonic() - t0 < 10
        assert h.refresh().state == "running"  # waiting does not stop it
    finally:
        h.kill()


def test_list_get_connect(shared: Sandbox) -> None:
    h = shared.commands.start("sleep 1000", tag="listed")
    try:
        procs = shared.commands.list()
        assert all(isinstance(p, ProcessInfo) for p in procs)
        mine = [p for p in procs if p.pid == h.pid]
        assert len(mine) == 1 and mine[0].tag == "listed" and mine[0].is_running
        again = shared.commands.connect(h.pid)
        assert again.pid == h.pid and again.info.tag == "listed"
        assert shared.commands.get(h.pid).state == "running"
    finally:
        assert shared.commands.kill(h.pid) is True
    with pytest.raises(NotFoundError):
        shared.commands.connect(999_999)
    with pytest.raises(NotFoundError):
        shared.commands.send_stdin(999_999, "x")
    with pytest.raises(NotFoundError):
        list(CommandHandle(shared, ProcessInfo(pid=999_999, argv=[], state="running")).output())
    with pytest.raises(NotFoundError):
        shared.commands.signal(999_999, "TERM")


def test_start_errors(sandbox: Sandbox) -> None:
    with pytest.raises(InvalidRequestError) as ei:
        sandbox.commands.start(["no-such-program"])
    assert ei.value.field == "command" and "not found" in ei.value.message
    with pytest.raises(InvalidRequestError) as ei:
        sandbox.commands.start("true", cwd="/no/such/dir")
    assert ei.value.field == "cwd"
    # with a shell line, bash starts and reports it
    assert sandbox.commands.start("no-such-program").wait(timeout=30).exit_code == 127
    h = sandbox.commands.start("sleep 1000")
    sandbox.pause()
    with pytest.raises(SandboxNotRunningError):
        sandbox.commands.start("true")
    with pytest.raises(SandboxNotRunningError):
        h.refresh()
    with pytest.raises(SandboxNotRunningError):
        h.wait(timeout=5)
    with pytest.raises(SandboxNotRunningError):
        h.kill()
    with pytest.raises(SandboxNotRunningError):
        sandbox.commands.list()
