"""The code interpreter: run_code and typed executions, contexts, resets."""

from __future__ import annotations

import json

import pytest

from conftest import skip_if_route_missing

from cella import (
    CodeContext,
    Execution,
    ExecutionError,
    ExecutionFailed,
    InvalidRequestError,
    KernelInfo,
    Sandbox,
    SandboxNotRunningError,
    UnknownLanguageError,
    UnknownRouteError,
)

CODE = "POST /api/v1/sandboxes/{id}/code/run"


@pytest.fixture(scope="module")
def code_sb(shared: Sandbox) -> Sandbox:
    try:
        shared.run_code("1")
    except UnknownRouteError as exc:
        skip_if_route_missing(exc, CODE)
    return shared


def test_result_and_streams(code_sb: Sandbox) -> None:
    ex = code_sb.run_code("print('to stdout')\nimport sys; print('to stderr', file=sys.stderr)\n6 * 7")
    assert isinstance(ex, Execution)
    assert ex.ok and ex.error is None and ex.language == "python"
    assert ex.stdout == "to stdout\n" and ex.stderr == "to stderr\n"
    assert ex.result == ex.text == "42"
    assert code_sb.run_code("x = 1").result is None  # a statement has no value


def test_error(code_sb: Sandbox) -> None:
    ex = code_sb.run_code("print('before')\n{}['missing']")
    assert not ex.ok and ex.stdout == "before\n"
    assert isinstance(ex.error, ExecutionError)
    assert ex.error.name == "KeyError" and ex.error.value == "'missing'"
    assert "Traceback" in ex.error.traceback and "KeyError" in ex.error.traceback
    assert str(ex.error) == "KeyError: 'missing'"
    with pytest.raises(ExecutionFailed) as ei:
        ex.raise_error()
    assert ei.value.execution is ex
    code_sb.run_code("1").raise_error()  # nothing raised


def test_rich_outputs(code_sb: Sandbox) -> None:
    ex = code_sb.run_code(
        "import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\n"
        "plt.plot([1, 3, 2])\nplt.title('t')\nplt.show()"
    )
    assert ex.ok, ex.error
    assert ex.png is not None and ex.png.startswith(b"\x89PNG\r\n\x1a\n")
    assert [o.mime for o in ex.images] == ["image/png"] and ex.images[0].is_binary
    ex = code_sb.run_code("import pandas as pd\ndf = pd.DataFrame({'a': [1, 2], 'b': [3, 4]})\ndf")
    assert ex.ok and ex.html is not None and "<table" in ex.html
    assert "a  b" in (ex.text or "")
    ex = code_sb.run_code(
        "class J:\n    def _repr_json_(self): return {'k': [1, 2]}\n"
        "    def _repr_svg_(self): return '<svg></svg>'\n"
        "    def _repr_markdown_(self): return '# md'\nJ()"
    )
    assert ex.json == {"k": [1, 2]} and ex.svg == "<svg></svg>" and ex.markdown == "# md"
    assert json.loads(ex.output("application/json").text) == {"k": [1, 2]}
    assert ex.jpeg is None and ex.output("image/gif") is None


def test_contexts_keep_state(code_sb: Sandbox) -> None:
    code_sb.run_code("counter = 10", context="ctx-a")
    code_sb.run_code("counter = 99", context="ctx-b")
    assert code_sb.run_code("counter += 1; counter", context="ctx-a").text == "11"
    assert code_sb.run_code("counter", context="ctx-b").text == "99"
    ex = code_sb.run_code("counter", context="fresh-ctx")
    assert ex.error is not None and ex.error.name == "NameError"


def test_javascript(code_sb: Sandbox) -> None:
    ex = code_sb.run_code("const xs = [1, 2, 3];\nconsole.log('js');\nxs.map(x => x * 2)", language="javascript")
    assert ex.ok and ex.language == "javascript" and ex.stdout == "js\n" and ex.text == "[ 2, 4, 6 ]"
    ex = code_sb.run_code("throw new TypeError('nope')", language="js")
    assert not ex.ok and ex.error.name == "TypeError" and ex.error.value == "nope"


def test_timeout_interrupts_cell(code_sb: Sandbox) -> None:
    code_sb.run_code("survivor = 'still here'", context="slow")
    ex = code_sb.run_code("import time\nwhile True: time.sleep(0.01)", context="slow", timeout=1)
    assert not ex.ok and ex.error.name == "TimeoutError"
    assert code_sb.run_code("survivor", context="slow").text == "'still here'"


def test_run_code_errors(code_sb: Sandbox, sandbox: Sandbox) -> None:
    with pytest.raises(UnknownLanguageError) as ei:
        code_sb.run_code("1", language="cobol")
    assert ei.value.code == "UNKNOWN_LANGUAGE" and ei.value.status == 400 and ei.value.field == "language"
    assert isinstance(ei.value, InvalidRequestError)
    with pytest.raises(InvalidRequestError) as ei2:
        code_sb.run_code("1", context="no spaces allowed")
    assert ei2.value.field == "context"
    with pytest.raises(InvalidRequestError) as ei3:
        code_sb.run_code("1", timeout=-1)
    assert ei3.value.field == "timeout"
    sandbox.pause()
    with pytest.raises(SandboxNotRunningError):
        sandbox.run_code("1")


def test_context_management(code_sb: Sandbox, sandbox: Sandbox) -> None:
    created = code_sb.code.create_context("managed")
    assert created == CodeContext("managed", "python")
    names = [c.name for c in code_sb.code.contexts()]
    assert "managed" in names
    code_sb.run_code("v = 5", context="managed")
    kernels = code_sb.code.state()
    assert all(isinstance(k, KernelInfo) for k in kernels)
    py = next(k for k in kernels if k.language == "python")
    assert py.running and "managed" in py.contexts and not py.busy
    assert code_sb.code.reset_context("managed") is True
    assert code_sb.run_code("v", context="managed").error.name == "NameError"
    assert code_sb.code.reset_context("never-made") is False
    code_sb.code.create_context("jsctx", language="javascript")
    js = code_sb.code.contexts(language="javascript")
    assert "jsctx" in [c.name for c in js] and {c.language for c in js} == {"javascript"}
    code_sb.run_code("keep = 1")
    code_sb.code.reset()
    assert code_sb.run_code("keep").error.name == "NameError"
    with pytest.raises(UnknownLanguageError):
        code_sb.code.contexts(language="cobol")
    with pytest.raises(InvalidRequestError):
        code_sb.code.create_context("bad name!")
    sandbox.pause()
    with pytest.raises(SandboxNotRunningError):
        sandbox.code.state()
