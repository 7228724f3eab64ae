"""This README's examples, as printed: the python blocks run in order in one namespace (the
quick start on its own), against the test server, in a temporary working directory; they must
succeed and leave no sandbox running."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import httpx

from cella_server import Server

README = Path(__file__).resolve().parent.parent / "README.md"


def blocks() -> list:
    text = README.read_text()
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def live(server: Server) -> list:
    r = httpx.get(f"{server.url}/api/v1/sandboxes", headers={"Authorization": f"Bearer {server.api_key}"})
    r.raise_for_status()
    return [s["id"] for s in r.json()["data"]]


def make_repository(server: Server, name: str) -> Path:
    """A bare repository with a README on main, where the embedded `git` forge finds it
    (DATA_DIR/repos/owner/name)."""
    bare = Path(server.data_dir) / "data" / "repos" / name
    git = ["git", "-c", "user.name=test", "-c", "user.email=test@example.org", "-c", "init.defaultBranch=main"]
    work = Path(tempfile.mkdtemp(prefix="cella-readme-repo-"))
    try:
        subprocess.run(git + ["init", "-q", str(work)], check=True)
        (work / "README.md").write_text("# web\n")
        subprocess.run(git + ["-C", str(work), "add", "-A"], check=True)
        subprocess.run(git + ["-C", str(work), "commit", "-qm", "Initial commit"], check=True)
        bare.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(git + ["clone", "-q", "--bare", str(work), str(bare)], check=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return bare


def test_every_readme_example_runs_as_printed(server: Server, tmp_path: Path, capsys) -> None:
    bare = make_repository(server, "acme/web")
    found = blocks()
    assert len(found) >= 7, "the README's examples were not found"
    before = set(live(server))
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        # The quick start stands alone; the rest are one session.
        exec(compile(found[0], "README quick start", "exec"), {})
        session: dict = {}
        for i, code in enumerate(found[1:], start=2):
            exec(compile(code, f"README block {i}", "exec"), session)
    finally:
        os.chdir(cwd)
    out = capsys.readouterr().out
    assert "hello from sb" in out
    assert "ZeroDivisionError" in out and "[ 2, 4 ]" in out
    assert (tmp_path / "plot.png").read_bytes().startswith(b"\x89PNG")
    assert set(live(server)) <= before, "the examples left sandboxes running"
    assert "hello terminal" in out
    # The task run's branch, with the agent's commit.
    branch = [line.split()[1] for line in out.splitlines() if line.startswith("stopped cella/")][0]
    shown = subprocess.run(["git", "--git-dir", str(bare), "show", f"{branch}:README.md"], capture_output=True, text=True, check=True)
    assert shown.stdout == "# web\nSay hello in the README\n"
