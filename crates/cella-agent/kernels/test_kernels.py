#!/usr/bin/env python3
"""Tests of the Cella code-interpreter drivers, python.py and node.js, through their protocol.

Run with: /usr/bin/python3 crates/cella-agent/kernels/test_kernels.py
Each test starts a driver as the agent does (requests on stdin, answers read from a pipe wired to
the driver's fd 3), and checks on teardown that it exits 0 at EOF and wrote no answer to fd 1.
"""
import base64
import fcntl
import json
import os
import select
import shutil
import signal
import subprocess
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON = ["/usr/bin/python3", "-u", os.path.join(HERE, "python.py")]
NODE = ["/usr/bin/node", os.path.join(HERE, "node.js")]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


class Driver:
    """A driver process with the answer pipe as its fd 3."""

    def __init__(self, argv, cwd):
        r, w = os.pipe()
        # Move both ends out of the way, so that fd 3 of this process can be borrowed below.
        self.answers = fcntl.fcntl(r, fcntl.F_DUPFD_CLOEXEC, 10)
        write_end = fcntl.fcntl(w, fcntl.F_DUPFD_CLOEXEC, 10)
        os.close(r)
        os.close(w)
        try:
            saved = fcntl.fcntl(3, fcntl.F_DUPFD_CLOEXEC, 10)
        except OSError:
            saved = None
        os.dup2(write_end, 3)  # the child inherits it as fd 3 (pass_fds)
        try:
            self.out, self.err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
            env = {"HOME": cwd, "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "MPLBACKEND": "Agg"}
            if "PYTHONPATH" in os.environ:
                env["PYTHONPATH"] = os.environ["PYTHONPATH"]
            self.proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=self.out,
                                         stderr=self.err, pass_fds=(3,))
        finally:
            if saved is None:
                os.close(3)
            else:
                os.dup2(saved, 3, inheritable=False)
                os.close(saved)
            os.close(write_end)
        self.buf, self.last_id = b"", 0

    def stderr(self):
        self.err.seek(0)
        return self.err.read().decode("utf-8", "replace")

    def send(self, op, **fields):
        self.last_id += 1
        self.proc.stdin.write((json.dumps({"op": op, "id": self.last_id, **fields}) + "\n").encode())
        self.proc.stdin.flush()
        return self.last_id

    def answer(self, req_id, wait=30):
        deadline = time.monotonic() + wait
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.answers], [], [], left)[0]:
                raise AssertionError(f"no answer within {wait}s; driver stderr:\n{self.stderr()}")
            chunk = os.read(self.answers, 1 << 16)
            if not chunk:
                raise AssertionError(f"driver closed its answer pipe; stderr:\n{self.stderr()}")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        msg = json.loads(line)
        assert msg["id"] == req_id, (msg, req_id)
        return msg

    def request(self, op, **fields):
        return self.answer(self.send(op, **fields))

    def run(self, code, context="default", timeout=10):
        return self.request("run", code=code, context=context, timeout=timeout)

    def close(self):
        self.proc.stdin.close()
        try:
            return self.proc.wait(10)
        finally:
            os.close(self.answers)


class DriverTest(unittest.TestCase):
    argv = None

    def setUp(self):
        self.home = tempfile.mkdtemp(prefix="cella-kernel-test-")
        self.k = Driver(self.argv, self.home)

    def tearDown(self):
        rc = self.k.close()
        self.k.out.seek(0)
        stdout, stderr = self.k.out.read(), self.k.stderr()
        self.k.out.close()
        self.k.err.close()
        shutil.rmtree(self.home)
        self.assertEqual(rc, 0, f"driver exit status at EOF; stderr:\n{stderr}")
        self.assertNotIn(b'"id"', stdout, "protocol data written to fd 1")

    def ok(self, code, result, context="default", **kw):
        a = self.k.run(code, context=context, **kw)
        self.assertTrue(a["ok"], a)
        self.assertEqual(a["result"], result, a)
        return a

    def fails(self, code, name, context="default", **kw):
        a = self.k.run(code, context=context, **kw)
        self.assertFalse(a["ok"], a)
        self.assertEqual(a["error"]["name"], name, a)
        return a

    def check_context_ops(self, declare, read):
        self.assertEqual(self.k.request("contexts"), {"id": self.k.last_id, "ok": True, "contexts": []})
        self.assertEqual(self.k.request("create", context="c1")["created"], True)
        self.assertEqual(self.k.request("create", context="c1")["created"], False)
        self.ok(declare, None, context="c1")
        self.ok("1", "1")
        self.assertEqual(self.k.request("contexts")["contexts"], ["c1", "default"])
        self.assertTrue(self.k.request("reset", context="c1")["ok"])
        self.assertTrue(self.k.request("reset", context="never-made")["ok"])
        self.assertEqual(self.k.request("contexts")["contexts"], ["default"])
        return self.k.run(read, context="c1")  # a fresh context: the name is gone

    def check_protocol_errors(self):
        self.k.proc.stdin.write(b"not json\n")
        self.k.proc.stdin.flush()
        a = self.k.answer(None)
        self.assertFalse(a["ok"])
        a = self.k.request("frobnicate")
        self.assertFalse(a["ok"], a)
        self.assertEqual(self.k.request("ping")["ok"], True)

    def check_sigint(self, endless):
        req = self.k.send("run", code=endless, context="default", timeout=60)
        time.sleep(0.5)
        self.k.proc.send_signal(signal.SIGINT)
        a = self.k.answer(req, wait=10)
        self.assertFalse(a["ok"], a)
        self.assertEqual(a["error"]["name"], "KeyboardInterrupt")
        self.k.proc.send_signal(signal.SIGINT)  # while idle: ignored
        time.sleep(0.3)
        self.assertTrue(self.k.request("ping")["ok"])


class PythonDriverTest(DriverTest):
    argv = PYTHON

    def test_seed_example(self):
        a = self.ok("total = sum(range(10))\ntotal", "45")
        self.assertEqual((a["stdout"], a["stderr"], a["error"], a["outputs"]), ("", "", None, []))

    def test_persistence_across_cells(self):
        self.ok("import math\nx = 10\ndef f(y):\n    return x + y", None)
        self.ok("f(math.floor(2.5))", "12")
        self.ok("class C:\n    pass\nc = C()", None)
        self.ok("type(c).__name__, __name__", "('C', '__main__')")

    def test_contexts_are_separate(self):
        self.ok("x = 1", None, context="a")
        self.fails("x", "NameError", context="b")
        self.ok("x", "1", context="a")

    def test_exception_then_working_cell(self):
        self.ok("x = 5", None)
        a = self.fails("y = 1\n\n1/0", "ZeroDivisionError")
        self.assertEqual(a["error"]["value"], "division by zero")
        tb = a["error"]["traceback"]
        self.assertTrue(tb.startswith("Traceback (most recent call last):\n"), tb)
        self.assertIn('File "<cell 2>", line 3, in <module>\n    1/0', tb)
        self.assertNotIn("python.py", tb)
        self.ok("x + y", "6")

    def test_syntax_error(self):
        a = self.fails("x = 1\ndef (:", "SyntaxError")
        self.assertIn('File "<cell 1>", line 2', a["error"]["traceback"])
        self.ok("2 + 2", "4")

    def test_timeout_interrupts_and_context_survives(self):
        self.ok("x = 7", None)
        start = time.monotonic()
        a = self.fails("while True: pass", "TimeoutError", timeout=1)
        self.assertLess(time.monotonic() - start, 5)
        self.assertEqual(a["error"]["value"], "cell exceeded its timeout of 1s and was interrupted")
        self.assertIn("<cell 2>", a["error"]["traceback"])
        self.fails("while True:\n    try:\n        pass\n    except Exception:\n        pass", "TimeoutError", timeout=0.5)
        self.ok("x", "7")

    def test_sigint_interrupts_sleep(self):
        self.ok("x = 3", None)
        self.check_sigint("import time\ntime.sleep(30)")
        self.ok("x", "3")

    def test_system_exit_is_an_error(self):
        a = self.fails("import sys\nsys.exit(3)", "SystemExit")
        self.assertEqual(a["error"]["value"], "3")
        self.fails("exit()", "SystemExit")
        self.ok("'alive'", "'alive'")

    def test_fd_level_capture(self):
        a = self.ok("import os, subprocess, sys\nos.system('echo hi')\nprint('py')\n"
                    "subprocess.run(['sh', '-c', 'echo err >&2'])\nprint('e2', file=sys.stderr)", None)
        self.assertEqual(a["stdout"], "hi\npy\n")
        self.assertEqual(a["stderr"], "err\ne2\n")
        self.fails("input()", "EOFError")  # stdin is not the request pipe

    def test_display_and_rich_reprs(self):
        self.ok("class H:\n    def _repr_html_(self):\n        return '<b>h</b>'\n    def __repr__(self):\n"
                "        return 'H()'\nclass P:\n    def _repr_png_(self):\n        return b'\\x89PNG\\r\\n\\x1a\\nxx'", None)
        a = self.ok("display(H(), 42)\nH()", "H()")
        self.assertEqual(a["outputs"], [{"mime": "text/html", "data": "<b>h</b>"}, {"mime": "text/plain", "data": "42"},
                                        {"mime": "text/html", "data": "<b>h</b>"}])
        a = self.k.run("P()")
        self.assertTrue(a["result"].startswith("<__main__.P object at "), a)
        self.assertEqual([o["mime"] for o in a["outputs"]], ["image/png"])
        self.assertEqual(base64.b64decode(a["outputs"][0]["data"]), PNG_SIGNATURE + b"xx")

    def test_context_ops(self):
        self.assertEqual(self.check_context_ops("v = 1", "v")["error"]["name"], "NameError")

    def test_protocol_errors(self):
        self.check_protocol_errors()

    def test_import_from_working_directory(self):
        self.ok("1", "1")
        with open(os.path.join(self.home, "mymod.py"), "w") as f:
            f.write("V = 'from cwd'\n")
        self.ok("import mymod\nmymod.V", "'from cwd'")

    def test_top_level_await(self):
        self.ok("import asyncio\nawait asyncio.sleep(0.01)\nv = 5", None)
        self.ok("async def g():\n    return v + 1\nawait g()", "6")
        self.fails("await asyncio.sleep(30)", "TimeoutError", timeout=0.5)
        self.ok("v", "5")

    def test_matplotlib_figure(self):
        if not self.k.run("import matplotlib")["ok"]:
            self.skipTest("matplotlib is not installed")
        a = self.ok("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nNone", None)
        self.assertEqual([o["mime"] for o in a["outputs"]], ["image/png"], a)
        self.assertTrue(base64.b64decode(a["outputs"][0]["data"]).startswith(PNG_SIGNATURE))
        a = self.ok("plt.plot([1])\nplt.show()\nplt.plot([2])\nplt.show()", None)  # two figures
        self.assertEqual([o["mime"] for o in a["outputs"]], ["image/png", "image/png"], a)
        self.assertEqual(self.ok("len(plt.get_fignums())", "0")["outputs"], [])


class NodeDriverTest(DriverTest):
    argv = NODE

    def test_let_const_persist_and_redeclare(self):
        self.ok("const a = 1; let b = 2; a + b", "3")
        self.ok("a + b", "3")
        self.ok("const a = 10; let b = 20\na + b", "30")
        self.ok("class A { m() { return 1 } }", None)
        self.ok("class A { m() { return 2 } }\nnew A().m()", "2")
        self.ok("{ let inner = 1 }\ntypeof inner", "'undefined'")

    def test_top_level_await(self):
        self.ok("const r = await Promise.resolve(41); r + 1", "42")
        self.ok("r", "41")
        self.ok("const { s, t: [u] } = await new Promise((ok) => setTimeout(() => ok({ s: 'x', t: [7] }), 20)); s", "'x'")
        self.ok("[s, u]", "[ 'x', 7 ]")
        self.ok("let n = 0\nasync function bump() { await null; return ++n }\nawait bump()\nawait bump()", "2")
        self.ok("n + 0", "2")  # the closure wrote the global
        self.ok("const d = await (async () => ({ v: 1 }))(); d.v", "1")  # a script would call a function `await`
        self.ok("d", "{ v: 1 }")

    def test_function_declarations_persist(self):
        self.ok("function sq(x) { return x * x }", None)
        self.ok("sq(7)", "49")
        self.ok("function* gen() { yield 1 }\nasync function af() { return 2 }\nawait af()", "2")
        self.ok("[...gen()].length + sq(2)", "5")

    def test_sync_infinite_loop_interrupted(self):
        self.ok("let kept = 'yes'", None)
        start = time.monotonic()
        a = self.fails("while (true) {}", "TimeoutError", timeout=1)
        self.assertLess(time.monotonic() - start, 5)
        self.assertEqual(a["error"]["value"], "cell exceeded its timeout of 1s and was interrupted")
        self.ok("kept", "'yes'")

    def test_never_settling_await_interrupted(self):
        self.ok("const kept = 1", None)
        self.fails("await new Promise(() => {})", "TimeoutError", timeout=1)
        self.ok("kept + 1", "2")

    def test_thrown_errors(self):
        a = self.fails("throw new TypeError('bad')", "TypeError")
        self.assertEqual(a["error"]["value"], "bad")
        self.assertIn("TypeError: bad\n    at <cell 1>:1", a["error"]["traceback"])
        self.assertNotIn("node.js", a["error"]["traceback"])
        a = self.fails("throw 5", "Error")
        self.assertEqual(a["error"]["value"], "5")
        self.fails("await Promise.reject(new RangeError('r'))", "RangeError")
        self.fails("let = ;", "SyntaxError")
        self.ok("1 + 1", "2")

    def test_console_captured(self):
        a = self.ok("console.log('hi', { x: 1 }); console.error('oops'); process.stdout.write('raw\\n'); undefined", None)
        self.assertEqual((a["stdout"], a["stderr"]), ("hi { x: 1 }\nraw\n", "oops\n"))
        a = self.ok("await new Promise((ok) => setTimeout(() => { console.log('later'); ok() }, 20))", None)
        self.assertEqual(a["stdout"], "later\n")

    def test_require_fs(self):
        self.ok("const fs = require('fs')\nfs.writeFileSync('f.txt', 'data')\nfs.readFileSync('f.txt', 'utf8')", "'data'")
        with open(os.path.join(self.home, "m.js"), "w") as f:
            f.write("module.exports = 6;\n")
        self.ok("require('./m.js') * 7", "42")

    def test_display(self):
        a = self.ok("display({ a: 1 }); display('txt'); display('<b>x</b>', 'text/html')", None)
        self.assertEqual(a["outputs"], [{"mime": "application/json", "data": '{"a":1}'},
                                        {"mime": "text/plain", "data": "txt"}, {"mime": "text/html", "data": "<b>x</b>"}])

    def test_driver_survives(self):
        self.fails("process.exit(2)", "ProcessExit")
        a = self.ok("Promise.reject(new Error('x')); setTimeout(() => { throw new Error('late') }, 0); 1", "1")
        self.assertIn("Unhandled promise rejection", a["stderr"])
        time.sleep(0.1)
        self.ok("'alive'", "'alive'")

    def test_results(self):
        self.ok("undefined", None)
        self.ok("'abc'", "'abc'")
        self.ok("({ a: [1, 2] })", "{ a: [ 1, 2 ] }")
        self.ok("x = 5\n+2", "7")
        self.ok("const re = /[/}]/g; const t = `a${ { y: '}' }.y }b`\nt", "'a}b'")

    def test_contexts_are_separate(self):
        self.ok("const a = 1", None, context="one")
        self.ok("typeof a", "'undefined'", context="two")
        self.ok("a", "1", context="one")

    def test_context_ops(self):
        self.assertEqual(self.check_context_ops("const v = 1", "typeof v")["result"], "'undefined'")

    def test_protocol_errors(self):
        self.check_protocol_errors()

    def test_sigint_interrupts_loop(self):
        self.ok("const kept = 1", None)
        self.check_sigint("while (true) {}")
        self.check_sigint("await new Promise(() => {})")
        self.ok("kept", "1")


if __name__ == "__main__":
    unittest.main(verbosity=2)
