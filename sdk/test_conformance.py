"""Unit tests of sdk/conformance.py: parsing the manifests and the internal routes, finding
definitions in each language's sources, and the check over a small tree of fixture SDKs.

    python3 -m pytest -q sdk/test_conformance.py
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import conformance as c  # noqa: E402

DOC = {
    "openapi": "3.1.0",
    "paths": {
        "/api/v1/sandboxes": {"get": {}, "post": {}, "parameters": []},
        "/api/v1/sandboxes/{id}": {"get": {}, "delete": {}, "summary": "not a method"},
        "/api/v1/sandboxes/{id}/exec": {"post": {}},
        "/api/v1/tasks/{task_id}/events": {"get": {}},
        "/healthz": {"get": {}},
    },
}


def write(root: Path, rel: str, text: str) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


# --------------------------------------------------------------------------- parsing


def test_normalize_drops_placeholder_names() -> None:
    assert c.normalize("/api/v1/sandboxes/{id}/processes/{pid}") == "/api/v1/sandboxes/{}/processes/{}"
    assert c.normalize("/api/v1/tasks/{x}") == c.normalize("/api/v1/tasks/{task_id}")


def test_operations_of_takes_methods_only() -> None:
    ops = c.operations_of(DOC)
    assert ("GET", "/api/v1/sandboxes/{}") in ops and ("DELETE", "/api/v1/sandboxes/{}") in ops
    assert ops[("GET", "/api/v1/tasks/{}/events")] == "/api/v1/tasks/{task_id}/events"
    assert len(ops) == 7  # "parameters" and "summary" are no operations


def test_parse_manifest() -> None:
    m = c.parse_manifest(
        "# comment\n"
        "\n"
        "GET /api/v1/sandboxes\tSandbox.list\n"
        "POST /api/v1/sandboxes    Sandbox.create\n"  # spaces: a warning
        "get /api/v1/sandboxes\tSandbox.list\n"  # lower case: an error
        "FETCH /api/v1/sandboxes\tSandbox.list\n"  # no such method
        "GET api/v1/sandboxes\tSandbox.list\n"  # no leading slash
        "GET /api/v1/sandboxes\n"  # no symbol
        "   # an indented comment\n"
        "DELETE /api/v1/sandboxes/{sid}\tCella.Sandbox.destroy!\n"
    )
    assert [(e.line, e.method, e.path, e.symbol) for e in m.entries] == [
        (3, "GET", "/api/v1/sandboxes", "Sandbox.list"),
        (4, "POST", "/api/v1/sandboxes", "Sandbox.create"),
        (10, "DELETE", "/api/v1/sandboxes/{sid}", "Cella.Sandbox.destroy!"),
    ]
    assert [w.split(":")[0] for w in m.warnings] == ["line 4"]
    assert [e.split(":")[0] for e in m.errors] == ["line 5", "line 6", "line 7", "line 8"]
    assert m.entries[2].name == "destroy!" and m.entries[2].op == ("DELETE", "/api/v1/sandboxes/{}")
    assert c.Entry(1, "GET", "/x", "cella.sandbox.run_code").name == "run_code"


def test_parse_routes() -> None:
    routes, errors = c.parse_routes(
        "# why\nGET /healthz   # a probe\nPOST /api/v1/sessions\n\nnot a route\nget /x\n"
    )
    assert [r for _, r in routes] == [("GET", "/healthz"), ("POST", "/api/v1/sessions")]
    assert [e.split(":")[0] for e in errors] == ["line 5", "line 6"]


# --------------------------------------------------------------------------- definitions per language


@pytest.mark.parametrize(
    "lang,source,name,defined",
    [
        ("python", "class Sandbox:\n    def create(cls):\n        pass\n", "create", True),
        ("python", "    async def run(self, code):\n", "run", True),
        ("python", "x = sandbox.create()\n", "create", False),
        ("python", "def created(x):\n", "create", False),
        ("go", "func (s *Sandbox) Exec(ctx context.Context) (*Result, error) {\n", "Exec", True),
        ("go", "func New(opts ...Option) *Client {\n", "New", True),
        ("go", "func (c *Client) List[T any](ctx context.Context) {\n", "List", True),
        ("go", "\tres, err := s.Exec(ctx)\n", "Exec", False),
        ("go", "func (s *Sandbox) ExecStream(ctx context.Context) {\n", "Exec", False),
        ("java", "    public ExecResult exec(String cmd) throws CellaException {\n", "exec", True),
        ("java", "    public static Sandbox create(CreateOptions o) {\n", "create", True),
        ("java", "    <T> List<T> list(Class<T> k) {\n", "list", True),
        ("java", "    Map<String, List<String>> headers() ;\n", "headers", True),
        ("java", "        return exec(cmd);\n", "exec", False),
        ("java", "        var r = sandbox.exec(cmd);\n", "exec", False),
        ("java", "        throw new exec(\"x\");\n", "exec", False),
        ("elixir", "  def exec(sandbox, cmd, opts \\\\ []) do\n", "exec", True),
        ("elixir", "  def exec!(sandbox, cmd) do\n", "exec!", True),
        ("elixir", "  def list do\n", "list", True),
        ("elixir", "  defdelegate get(id), to: Cella.Api\n", "get", True),
        ("elixir", "  defp exec(sandbox, cmd) do\n", "exec", False),
        ("elixir", "    Cella.Sandbox.exec(sb, \"ls\")\n", "exec", False),
        ("typescript", "export async function runCode(sb: Sandbox, code: string): Promise<Execution> {\n", "runCode", True),
        ("typescript", "class Sandbox {\n  static async create(opts: Options = {}): Promise<Sandbox> {\n", "create", True),
        ("typescript", "class Commands {\n  async run(\n    cmd: string,\n    opts?: RunOptions,\n  ): Promise<R> {\n", "run", True),
        ("typescript", "  async *events(id: string) {\n", "events", True),
        ("typescript", "  kill() {\n", "kill", True),
        ("typescript", "export const list = async (opts: O) => {\n", "list", True),
        ("typescript", "const r = await sandbox.create({});\n", "create", False),
        ("typescript", "  create(opts);\n", "create", False),
        ("typescript", "  return create(opts) + 1;\n", "create", False),
    ],
)
def test_definitions(lang: str, source: str, name: str, defined: bool) -> None:
    assert c.LANGUAGE_RULES[lang].defines(source, name) is defined


def test_source_files_skip_tests_and_builds(tmp_path: Path) -> None:
    for rel in ("src/a.ts", "src/a.d.ts", "src/a.test.ts", "node_modules/x/y.ts", "dist/a.js", "test/t.ts", "lib/b.mjs"):
        write(tmp_path, rel, "")
    found = [p.relative_to(tmp_path).as_posix() for p in c.source_files(tmp_path, c.LANGUAGE_RULES["typescript"])]
    assert found == ["lib/b.mjs", "src/a.ts"]
    for rel in ("client.go", "client_test.go", "internal/x.go", "testdata/y.go"):
        write(tmp_path / "go", rel, "")
    found = [p.relative_to(tmp_path / "go").as_posix() for p in c.source_files(tmp_path / "go", c.LANGUAGE_RULES["go"])]
    assert found == ["client.go", "internal/x.go"]


# --------------------------------------------------------------------------- the check


@pytest.fixture
def sdks(tmp_path: Path) -> Path:
    write(tmp_path, "python/operations.txt",
          "# python\nGET /api/v1/sandboxes\tSandbox.list\nPOST /api/v1/sandboxes\tSandbox.create\n"
          "GET /api/v1/sandboxes/{sandbox}\tSandbox.connect\nPOST /api/v1/sandboxes/{id}/exec\tCommands.run\n")
    write(tmp_path, "python/src/cella/sandbox.py",
          "class Sandbox:\n    def list(cls): ...\n    def create(cls): ...\n    def connect(cls, i): ...\n"
          "class Commands:\n    def run(self): ...\n")
    write(tmp_path, "python/tests/test_x.py", "def only_in_tests(): ...\n")
    write(tmp_path, "go/operations.txt",
          "GET /api/v1/sandboxes\tClient.ListSandboxes\nDELETE /api/v1/sandboxes/{id}\tSandbox.Kill\n")
    write(tmp_path, "go/cella.go",
          "package cella\nfunc (c *Client) ListSandboxes(ctx context.Context) {}\nfunc (s *Sandbox) Kill(ctx context.Context) error {}\n")
    write(tmp_path, "internal-routes.txt", "GET /healthz  # a probe\n")
    return tmp_path


def test_check_all_covered(sdks: Path) -> None:
    doc = json.loads(json.dumps(DOC))
    doc["paths"]["/api/v1/tasks/{task_id}/events"] = {}
    r = c.check(doc, sdks)
    assert r.languages == ["python", "go"] and r.status == {"python": "ok", "go": "ok"}
    assert r.problems == [] and r.uncovered == []
    assert r.coverage[("GET", "/api/v1/sandboxes")] == {"python", "go"}
    assert r.coverage[("DELETE", "/api/v1/sandboxes/{}")] == {"go"}
    t = c.table(r)
    assert t.splitlines()[0].split() == ["route", "python", "go"]
    row = [line for line in t.splitlines() if line.startswith("GET /api/v1/sandboxes ")][0]
    assert row.count("✓") == 2
    assert [line for line in t.splitlines() if line.startswith("GET /healthz")][0].endswith("internal")
    s = c.summary(r)
    assert "0 uncovered" in s and "python 4" in s and "go 2" in s and "0 problem(s)" in s


def test_check_finds_every_problem(sdks: Path) -> None:
    write(sdks, "go/operations.txt",
          "GET /api/v1/sandboxes\tClient.ListSandboxes\n"
          "GET /api/v1/nowhere\tClient.ListSandboxes\n"  # not a route
          "DELETE /api/v1/sandboxes/{id}\tSandbox.Destroy\n"  # not defined
          "GET /api/v1/sandboxes\tClient.ListSandboxes\n")  # twice: a warning
    (sdks / "java").mkdir()  # a directory without a manifest
    write(sdks, "internal-routes.txt", "GET /healthz\nGET /api/v1/gone\n")
    r = c.check(DOC, sdks)
    assert r.status == {"python": "ok", "go": "errors", "java": "missing"}
    text = "\n".join(r.problems)
    assert "java: no operations.txt (missing)" in text
    assert "go/operations.txt line 2: GET /api/v1/nowhere is not a route" in text
    assert "line 3: Sandbox.Destroy: no definition of 'Destroy'" in text
    assert "internal-routes.txt line 2: GET /api/v1/gone is not a route" in text
    assert "DELETE /api/v1/sandboxes/{id}: no SDK covers it" in text
    assert "GET /api/v1/tasks/{task_id}/events: no SDK covers it" in text
    assert any("listed twice" in w for w in r.warnings)
    assert r.uncovered == [("DELETE", "/api/v1/sandboxes/{}"), ("GET", "/api/v1/tasks/{}/events")]
    assert "UNCOVERED" in c.table(r)


def test_a_symbol_only_in_tests_is_undefined(sdks: Path) -> None:
    write(sdks, "python/operations.txt", "GET /api/v1/sandboxes\tSandbox.only_in_tests\n")
    r = c.check(DOC, sdks)
    assert any("only_in_tests" in p for p in r.problems)


def test_main_exit_codes(sdks: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = json.loads(json.dumps(DOC))
    doc["paths"]["/api/v1/tasks/{task_id}/events"] = {}
    ok = tmp_path / "ok.json"
    ok.write_text(json.dumps(doc))
    assert c.main(["--openapi", str(ok), "--sdk-dir", str(sdks)]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("conformance: 6 operations, 5 covered")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(DOC))
    assert c.main(["--openapi", str(bad), "--sdk-dir", str(sdks)]) == 1
    assert "problem: GET /api/v1/tasks/{task_id}/events" in capsys.readouterr().out
    (tmp_path / "broken.json").write_text("{")
    assert c.main(["--openapi", str(tmp_path / "broken.json"), "--sdk-dir", str(sdks)]) == 2
    before = set(Path(tempfile.gettempdir()).glob("cella-conformance-*"))
    assert c.main(["--bin", str(tmp_path / "no-such-binary"), "--sdk-dir", str(sdks)]) == 2
    assert set(Path(tempfile.gettempdir()).glob("cella-conformance-*")) == before  # nothing left behind


def test_fetch_openapi_starts_and_stops_the_server(tmp_path: Path) -> None:
    """A stand-in server binary: answers the document on --listen, and records its arguments
    (the config turns the sandbox pool off) and its bootstrap key."""
    record = tmp_path / "record.json"
    fake = tmp_path / "cella"
    fake.write_text(f"""#!{sys.executable}
import http.server, json, os, sys
args = sys.argv[1:]
host, port = args[args.index("--listen") + 1].rsplit(":", 1)
config = open(args[args.index("--config") + 1]).read()
json.dump({{"args": args, "config": config, "key": os.environ.get("CELLA_BOOTSTRAP_KEY")}}, open({str(record)!r}, "w"))
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ({json.dumps(DOC)!r} if self.path == "/api/v1/openapi.json" else "{{}}").encode()
        self.send_response(200 if self.path == "/api/v1/openapi.json" else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.HTTPServer((host, int(port)), H).serve_forever()
""")
    fake.chmod(0o755)
    doc = c.fetch_openapi(str(fake), timeout=30)
    assert c.operations_of(doc) == c.operations_of(DOC)
    seen = json.loads(record.read_text())
    assert seen["args"][0] == "serve" and "--data-dir" in seen["args"]
    assert "default = 0" in seen["config"] and seen["key"].startswith("conformance-")
    data_dir = Path(seen["args"][seen["args"].index("--data-dir") + 1])
    assert not data_dir.parent.exists()  # its directory is removed after
