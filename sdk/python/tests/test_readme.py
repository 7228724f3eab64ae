"""This README's examples, as printed: the python blocks run in order in one namespace (the
quick start on its own), against the test server, in a temporary working directory; they must
succeed and leave no sandbox running."""

from __future__ import annotations

import os
import re
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


def test_every_readme_example_runs_as_printed(server: Server, tmp_path: Path, capsys) -> None:
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
