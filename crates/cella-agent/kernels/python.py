"""Cella code-interpreter driver for Python (installed in a sandbox as /run/cella/kernel.py).

The agent starts one such process, `python3 -u kernel.py`, and talks to it over two pipes.
Requests arrive on stdin and answers leave on file descriptor 3, one JSON object per line, each
answer carrying the id of its request; requests are handled one at a time, in order:

  {"op":"run","id":N,"context":"default","code":"...","timeout":30}
      -> {"id":N,"ok":bool,"stdout":"..","stderr":"..","result":"45"|null,
          "error":null|{"name","value","traceback"},"outputs":[{"mime","data"},...]}
  {"op":"create","id":N,"context":"c"}  -> {"id":N,"ok":true,"created":bool}
  {"op":"reset","id":N,"context":"c"}   -> {"id":N,"ok":true}
  {"op":"contexts","id":N}              -> {"id":N,"ok":true,"contexts":["default",...]}
  {"op":"ping","id":N}                  -> {"id":N,"ok":true,"language":"python","version":"3.11.2"}
  anything else, or a line that is not JSON -> {"id":N|null,"ok":false,"error":{...}}

A context is a module namespace of its own (`__name__ == "__main__"`, installed as
sys.modules["__main__"] while its cells run, so pickle finds classes defined in cells). Cells run
in the main thread; top-level `await` works (on one event loop kept by the driver). Output is
captured at the descriptor level: fds 1 and 2 point at fresh memfds while a cell runs, so child
processes are captured too. The timeout is an interval timer whose SIGALRM handler raises in the
main thread (again every second, should the cell swallow it); SIGINT interrupts a running cell as
KeyboardInterrupt and is ignored while idle. On EOF on stdin the driver exits 0.

Limits: a cell blocked in C code that does not return to Python on a signal (os.system, a waiting
subprocess call, some extension loops) is interrupted only when that call returns; a cell can
still end the process (os._exit, os.kill, exhausting memory); threads and processes a cell starts
keep running afterwards, and what they print later goes to the driver's own stdout/stderr.
Captured output beyond 4 MiB per stream is cut (and says so).
"""
import ast
import base64
import builtins
import importlib
import importlib.util
import io
import json
import linecache
import os
import signal
import sys
import traceback
import types

# ---- Protocol channels. The driver keeps private duplicates (Python's dup() makes them
# close-on-exec) so that neither cells nor the processes they start can read requests or write
# answers. fd 0 becomes /dev/null (input() sees EOF); fds 1 and 2 are redirected around each cell.

def _private(fd):
    new = os.dup(fd)
    os.set_blocking(new, True)
    return new

_REQUESTS = os.fdopen(_private(0), "rb")
try:
    _ANSWERS = _private(3)
    os.close(3)
except OSError:  # started by hand without fd 3: answer on stdout instead
    _ANSWERS = _private(1)
_null = os.open(os.devnull, os.O_RDONLY)
os.dup2(_null, 0)
os.close(_null)
_SAVED_OUT, _SAVED_ERR = os.dup(1), os.dup(2)
_REAL_STDOUT, _REAL_STDERR = sys.stdout, sys.stderr
_DRIVER = (lambda: 0).__code__.co_filename  # frames from this file are hidden in tracebacks
_CAP = 4 << 20  # captured bytes kept per stream (the answer must fit one agent frame)
_CO_COROUTINE = 0x80  # inspect.CO_COROUTINE: code compiled with a top-level await
_FLAGS = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
sys.path[0] = ""  # import user modules from the working directory, as the REPL does

def _text(s):
    """A str that is safe to put in JSON for a strict parser (no lone surrogates)."""
    return s.encode("utf-8", "backslashreplace").decode("utf-8")

def _send(obj):
    data = memoryview((json.dumps(obj) + "\n").encode("utf-8"))
    while data:
        data = data[os.write(_ANSWERS, data):]

# ---- Driver state and interruption
_contexts = {}  # context name -> module whose __dict__ holds the context's globals
_cell = 0  # cells run so far (names them "<cell N>")
_in_cell = False  # signals raise only while a cell runs
_timed_out = False
_timeout = 0.0
_outputs = []  # rich outputs of the running cell
_shown = set()  # ids of figures display()ed in the running cell
_loop = None  # event loop for cells with a top-level await

class _CellTimeout(BaseException):
    """Raised in the main thread when a cell exceeds its timeout; a BaseException, so that
    `except Exception` in the cell does not swallow it. Reported as TimeoutError."""

_CellTimeout.__name__ = _CellTimeout.__qualname__ = "TimeoutError"
_CellTimeout.__module__ = "builtins"

def _on_alarm(signum, frame):
    global _timed_out
    if _in_cell:
        _timed_out = True
        raise _CellTimeout(f"cell exceeded its timeout of {_timeout:g}s and was interrupted")

def _on_sigint(signum, frame):
    if _in_cell:
        raise KeyboardInterrupt

def _handlers():
    # Installed again around every cell, in case a cell replaced them.
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.signal(signal.SIGINT, _on_sigint)

def _arm(timeout):
    global _in_cell, _timed_out, _timeout
    _handlers()
    _timed_out, _timeout = False, timeout
    if timeout > 0:
        signal.setitimer(signal.ITIMER_REAL, timeout, 1.0)  # repeats until disarmed
    _in_cell = True

def _disarm():
    global _in_cell
    _in_cell = False
    signal.setitimer(signal.ITIMER_REAL, 0)
    _handlers()

# ---- Descriptor-level capture of stdout and stderr
def _flush_std():
    for stream in (sys.stdout, sys.stderr, _REAL_STDOUT, _REAL_STDERR):
        try:
            stream.flush()
        except Exception:
            pass

def _capture_start():
    """Point fds 1 and 2 at two fresh anonymous files (fresh per cell, so that a process a cell
    left running cannot write into a later cell's output)."""
    _flush_std()
    sys.stdout, sys.stderr = _REAL_STDOUT, _REAL_STDERR
    fds = []
    for name in ("cella-stdout", "cella-stderr"):
        try:
            fds.append(os.memfd_create(name))
        except (AttributeError, OSError):  # no memfd: an unlinked temporary file does as well
            import tempfile
            fds.append(os.dup(tempfile.TemporaryFile().fileno()))
    os.dup2(fds[0], 1)
    os.dup2(fds[1], 2)
    return fds

def _capture_stop(fds):
    """Restore fds 1 and 2 (and sys.stdout/sys.stderr); return what the cell wrote to each."""
    _flush_std()
    sys.stdout, sys.stderr = _REAL_STDOUT, _REAL_STDERR
    os.dup2(_SAVED_OUT, 1)
    os.dup2(_SAVED_ERR, 2)
    texts = []
    for fd in fds:
        size = os.fstat(fd).st_size
        text = os.pread(fd, min(size, _CAP), 0).decode("utf-8", "replace")  # a file: read whole
        os.close(fd)
        if size > _CAP:
            text += f"\n[cella: output cut, the cell wrote {size} bytes]\n"
        texts.append(text)
    return texts

# ---- Rich outputs: IPython-style _repr_*_ methods, display(), matplotlib figures
_REPRS = (("_repr_png_", "image/png"), ("_repr_svg_", "image/svg+xml"), ("_repr_html_", "text/html"),
          ("_repr_json_", "application/json"), ("_repr_markdown_", "text/markdown"))

def _rich(obj):
    """The rich representations `obj` offers, as output dicts (binary data in base64)."""
    found = []
    if isinstance(obj, type):  # a class, not an instance: its _repr_*_ are unbound
        return found
    for attr, mime in _REPRS:
        try:
            method = getattr(obj, attr, None)
            data = method() if callable(method) else None
        except Exception as exc:
            print(f"{type(obj).__name__}.{attr}() failed: {exc!r}", file=sys.stderr)
            continue
        if isinstance(data, tuple):  # (data, metadata)
            data = data[0] if data else None
        if data is None:
            continue
        if isinstance(data, (bytes, bytearray, memoryview)):
            data = base64.b64encode(data).decode("ascii") if mime == "image/png" \
                else bytes(data).decode("utf-8", "replace")
        elif not isinstance(data, str):
            data = json.dumps(data, default=repr)
        found.append({"mime": mime, "data": _text(data)})
    return found

def _is_figure(obj):
    return type(obj).__module__ == "matplotlib.figure" and hasattr(obj, "savefig")

def _figure_png(fig):
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    return {"mime": "image/png", "data": base64.b64encode(buf.getvalue()).decode("ascii")}

def _flush_figures():
    """Emit every open pyplot figure (unless display()ed already) and close them all, as
    Jupyter's inline backend does. Does nothing unless the cells imported pyplot."""
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return
    try:
        for num in plt.get_fignums():
            fig = plt.figure(num)
            if id(fig) not in _shown:
                _outputs.append(_figure_png(fig))
    finally:
        plt.close("all")

def display(*objs, **_options):
    """Add rich outputs for `objs` to the running cell (text/plain repr if they have none)."""
    for obj in objs:
        if _is_figure(obj):
            _outputs.append(_figure_png(obj))
            _shown.add(id(obj))
        else:
            _outputs.extend(_rich(obj) or [{"mime": "text/plain", "data": _text(repr(obj))}])

class _PyplotShow:
    """Import hook: when a cell imports matplotlib.pyplot, replace plt.show() by _flush_figures,
    so that each plt.show() emits its figures right away (nothing imports matplotlib early)."""

    def find_spec(self, name, path=None, target=None):
        if name != "matplotlib.pyplot":
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        loader = spec.loader if spec else None
        if loader is not None and hasattr(loader, "exec_module"):
            run = loader.exec_module

            def exec_module(module):
                run(module)
                module.show = lambda *args, **kwargs: _flush_figures()
            loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, _PyplotShow())

# ---- Running cells
def _context(name):
    module = _contexts.get(name)
    if module is None:
        module = _contexts[name] = types.ModuleType("__main__")
        module.__dict__.update(__builtins__=builtins, display=display)
    return module

def _await(coro):
    """Run a top-level-await cell's coroutine to completion on the driver's event loop."""
    global _loop
    import asyncio
    if _loop is None or _loop.is_closed():
        _loop = asyncio.new_event_loop()
    asyncio.set_event_loop(_loop)
    task = _loop.create_task(coro)
    try:
        return _loop.run_until_complete(task)
    except BaseException:
        task.cancel()  # interrupted: it gets CancelledError whenever the loop runs next
        raise

def _evaluate(code, ns):
    value = eval(code, ns)
    return _await(value) if code.co_flags & _CO_COROUTINE else value

def _execute(source, filename, ns):
    """Run a cell; return the value of its last statement if that is an expression, else None."""
    tree = compile(source, filename, "exec", ast.PyCF_ONLY_AST | _FLAGS, dont_inherit=True)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    _evaluate(compile(tree, filename, "exec", _FLAGS, dont_inherit=True), ns)
    if last is None:
        return None
    return _evaluate(compile(ast.Expression(last.value), filename, "eval", _FLAGS, dont_inherit=True), ns)

def _strip(te, seen):
    """Remove the driver's frames from a TracebackException and the exceptions chained to it."""
    if te is None or id(te) in seen:
        return
    seen.add(id(te))
    te.stack = traceback.StackSummary.from_list([f for f in te.stack if f.filename != _DRIVER])
    for other in (te.__cause__, te.__context__, *(getattr(te, "exceptions", None) or ())):
        _strip(other, seen)

def _describe(exc):
    te = traceback.TracebackException(type(exc), exc, exc.__traceback__, compact=True)
    _strip(te, set())
    try:
        value = str(exc)
    except Exception:
        value = "<exception str() failed>"
    return {"name": type(exc).__name__, "value": _text(value), "traceback": _text("".join(te.format()))}

def _run(req):
    global _cell, _outputs, _shown
    timeout = float(req.get("timeout") or 0)
    source = str(req.get("code") or "")
    module = _context(str(req.get("context") or "default"))
    _cell += 1
    filename = f"<cell {_cell}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    sys.modules["__main__"] = module
    importlib.invalidate_caches()  # see modules written since the last cell
    _outputs, _shown = [], set()
    result = error = None
    fds = _capture_start()
    try:  # disarmed as soon as the cell is done, so that a late signal still lands in this try
        _arm(timeout)
        value = _execute(source, filename, module.__dict__)
        if value is not None:
            result = _text(repr(value))
            _outputs.extend(_rich(value))
        _flush_figures()
        _disarm()
    except BaseException as exc:  # SystemExit and KeyboardInterrupt included: the driver stays
        _disarm()
        error = _describe(exc)
    finally:
        _disarm()
        stdout, stderr = _capture_stop(fds)
    if error is None and _timed_out:  # the cell swallowed the timeout and went on
        error = {"name": "TimeoutError", "value": f"cell exceeded its timeout of {timeout:g}s", "traceback": ""}
    return {"ok": error is None, "stdout": stdout, "stderr": stderr, "result": result,
            "error": error, "outputs": _outputs}

def _handle(req):
    op = req.get("op")
    if op == "run":
        return _run(req)
    name = str(req.get("context") or "default")
    if op == "ping":
        return {"ok": True, "language": "python", "version": sys.version.split()[0]}
    if op == "contexts":
        return {"ok": True, "contexts": list(_contexts)}
    if op == "create":
        created = name not in _contexts
        _context(name)
        return {"ok": True, "created": created}
    if op == "reset":
        _contexts.pop(name, None)
        return {"ok": True}
    raise ValueError(f"unknown op {op!r}")

def main():
    _handlers()
    for line in _REQUESTS:
        if not line.strip():
            continue
        req = {}
        try:
            parsed = json.loads(line)
            if not isinstance(parsed, dict):
                raise ValueError("a request must be a JSON object")
            req = parsed
            answer = _handle(req)
        except BaseException as exc:  # a driver error answers this request; the driver goes on
            answer = {"ok": False, "error": _describe(exc)}
        _send({"id": req.get("id"), **answer})
    return 0

if __name__ == "__main__":
    sys.exit(main())
