#!/usr/bin/env python3
"""The SDKs' conformance check: which API operation each SDK exposes, against the routes of
the server's OpenAPI document.

    python3 sdk/conformance.py                      # starts $CELLA_BIN for the document
    python3 sdk/conformance.py --openapi FILE       # or reads it from a file

It reads ``sdk/<lang>/operations.txt`` of every SDK directory present (python, typescript,
go, java, elixir), one operation a line::

    METHOD /api/v1/path/{param}<TAB>Symbol          # '#' starts a comment line

and checks that

- every listed operation is one of the document's (placeholders may have any name),
- the last part of every symbol (``exec`` of ``Sandbox.exec``) is defined in that SDK's sources
  (Python ``def name(``, TypeScript a function or method ``name(...) {``, Go
  ``func (...) Name(`` or ``func Name(``, Java a method declaration ``name(``, Elixir
  ``def name``),
- every route of the document is covered by at least one SDK, unless it is listed in
  ``sdk/internal-routes.txt`` (``METHOD PATH`` lines with comments saying why),
- an SDK directory has a manifest (else it is reported ``missing``).

It prints a route × language table (``✓`` where the SDK covers the route, ``internal`` for
internal routes) and a summary line, and exits 1 on any problem, 2 when the document cannot be
had. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple

HERE = Path(__file__).resolve().parent
LANGUAGES = ("python", "typescript", "go", "java", "elixir")
METHODS = ("GET", "PUT", "POST", "DELETE", "PATCH", "HEAD", "OPTIONS")

Op = Tuple[str, str]  # (METHOD, path with every placeholder written "{}")


def normalize(path: str) -> str:
    """A path with its placeholders' names dropped: ``/a/{id}/b/{x}`` -> ``/a/{}/b/{}``."""
    return re.sub(r"\{[^}/]*\}", "{}", path.strip())


# --------------------------------------------------------------------------- the document


def operations_of(doc: dict) -> Dict[Op, str]:
    """The operations of an OpenAPI document: (METHOD, normalized path) -> the path as written."""
    ops: Dict[Op, str] = {}
    for path, item in (doc.get("paths") or {}).items():
        if not isinstance(item, dict):
            continue
        for method in item:
            if method.upper() in METHODS:
                ops[(method.upper(), normalize(path))] = path
    return ops


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Servers keep a pool of pre-booted sandboxes by default; the document needs none.
NO_POOL = "[pool]\ndefault = 0\nsizes = {}\n"


def fetch_openapi(binary: str, timeout: float = 60.0) -> dict:
    """Start the server on a free port of 127.0.0.1 with a temporary data directory, a random
    bootstrap key and no sandbox pool, read ``/api/v1/openapi.json``, stop it and remove its
    directory."""
    work = tempfile.mkdtemp(prefix="cella-conformance-")
    try:
        config = os.path.join(work, "config.toml")
        Path(config).write_text(NO_POOL)
        return _fetch(binary, work, ["--config", config], timeout)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _fetch(binary: str, work: str, extra: List[str], timeout: float) -> dict:
    port = free_port()
    env = dict(os.environ, CELLA_BOOTSTRAP_KEY="conformance-" + secrets.token_hex(16))
    log_path = os.path.join(work, "server.log")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [binary, "serve", "--listen", f"127.0.0.1:{port}", "--data-dir", os.path.join(work, "data"), *extra],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True,
        )
    try:
        url = f"http://127.0.0.1:{port}/api/v1/openapi.json"
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(url, timeout=5) as resp:
                    return json.loads(resp.read().decode("utf-8"))
            except (urllib.error.URLError, ConnectionError, OSError):
                if proc.poll() is not None or time.monotonic() > deadline:
                    tail = Path(log_path).read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"the server ({binary}) did not answer {url}:\n{tail}") from None
                time.sleep(0.1)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


# --------------------------------------------------------------------------- manifests


@dataclass
class Entry:
    line: int
    method: str
    path: str
    symbol: str

    @property
    def op(self) -> Op:
        return (self.method, normalize(self.path))

    @property
    def name(self) -> str:
        """The symbol's last part: ``exec`` of ``Sandbox.exec``, ``exec!`` of ``Cella.Sandbox.exec!``."""
        return re.split(r"[.#:]", self.symbol)[-1]


@dataclass
class Manifest:
    entries: List[Entry] = field(default_factory=list)
    errors: List[str] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)


_LINE = re.compile(r"^(?P<method>[A-Za-z]+) (?P<path>/\S*)(?P<sep>\t|[ \t]+)(?P<symbol>\S+)$")


def parse_manifest(text: str) -> Manifest:
    """Parse an ``operations.txt``: ``METHOD PATH<TAB>Symbol`` lines, ``#`` comments, blank
    lines. Spaces instead of the TAB are a warning; anything else on a line is an error."""
    m = Manifest()
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _LINE.match(line)
        if not match:
            m.errors.append(f"line {n}: not 'METHOD /path<TAB>Symbol': {raw!r}")
            continue
        method = match.group("method")
        if method.upper() not in METHODS or method != method.upper():
            m.errors.append(f"line {n}: {method!r} is not an HTTP method in capitals")
            continue
        if match.group("sep") != "\t":
            m.warnings.append(f"line {n}: a TAB goes between the route and the symbol")
        m.entries.append(Entry(n, method, match.group("path"), match.group("symbol")))
    return m


def parse_routes(text: str) -> Tuple[List[Tuple[int, Op]], List[str]]:
    """Parse ``internal-routes.txt``: ``METHOD PATH`` lines (anything after the path, and lines
    starting with ``#``, are comments)."""
    routes: List[Tuple[int, Op]] = []
    errors: List[str] = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip() if not raw.strip().startswith("#") else ""
        if not line:
            continue
        parts = line.split()
        if len(parts) < 2 or parts[0] not in METHODS or not parts[1].startswith("/"):
            errors.append(f"line {n}: not 'METHOD /path': {raw!r}")
            continue
        routes.append((n, (parts[0], normalize(parts[1]))))
    return routes, errors


# --------------------------------------------------------------------------- sources

SKIP_DIRS = {"test", "tests", "node_modules", "target", "_build", "deps", "dist", "build", "vendor", ".git",
             "__pycache__", "examples", "testdata"}


@dataclass
class Language:
    name: str
    suffixes: Tuple[str, ...]
    defines: Callable[[str, str], bool]  # (source text, name) -> defined there
    exclude: Tuple[str, ...] = ()  # name endings of files that are not sources (tests, declarations)


def _python_defines(text: str, name: str) -> bool:
    return re.search(rf"^[ \t]*(?:async[ \t]+)?def[ \t]+{re.escape(name)}[ \t]*\(", text, re.M) is not None


def _go_defines(text: str, name: str) -> bool:
    # A method `func (s *Sandbox) Exec(` or a function `func Exec(` (type parameters allowed).
    return re.search(rf"^func[ \t]*(?:\([^)]*\)[ \t]*)?{re.escape(name)}[ \t]*(?:\[[^\]]*\][ \t]*)?\(", text, re.M) is not None


_JAVA_NOT_TYPES = {"return", "new", "throw", "else", "case", "yield", "await", "assert"}


def _java_defines(text: str, name: str) -> bool:
    # A method declaration: modifiers, optional type parameters, a return type, then the name.
    pattern = re.compile(
        rf"^[ \t]*(?:@\w+(?:\([^)]*\))?[ \t]+)*"
        rf"(?:(?:public|protected|private|static|final|abstract|synchronized|default|native|strictfp)[ \t]+)*"
        rf"(?:<[^>]*>[ \t]*)?(?P<type>[A-Za-z_$][\w$.]*(?:<[^()]*>)?(?:\[\])*)[ \t]+{re.escape(name)}[ \t]*\(",
        re.M,
    )
    return any(m.group("type") not in _JAVA_NOT_TYPES for m in pattern.finditer(text))


def _elixir_defines(text: str, name: str) -> bool:
    # `def name(`, `def name,` / `def name do` (no arguments); defdelegate counts as a def.
    return re.search(rf"^[ \t]*(?:def|defdelegate)[ \t]+{re.escape(name)}(?:[ \t]*\(|[ \t]*,|[ \t]+do\b|[ \t]*$)", text, re.M) is not None


_TS_NOT_NAMES = {"if", "for", "while", "switch", "catch", "return", "function", "await", "new", "typeof"}


def _balanced_end(text: str, i: int) -> int:
    """The index just past the parenthesis that closes the one at ``text[i]`` (or -1)."""
    depth = 0
    for j in range(i, len(text)):
        c = text[j]
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return j + 1
    return -1


def _ts_defines(text: str, name: str) -> bool:
    n = re.escape(name)
    # function declarations and expressions, and arrow functions bound to the name
    if re.search(rf"\bfunction[ \t]*\*?[ \t]*{n}[ \t]*(?:<[^>]*>)?[ \t]*\(", text):
        return True
    if re.search(rf"\b{n}[ \t]*[:=][ \t]*(?:async[ \t]+)?(?:function\b|\([^)]*\)[ \t]*(?::[^=]*)?=>|\w+[ \t]*=>)", text):
        return True
    # class and object-literal methods: `name(...) {` or `name(...): Type {`, a call is not one
    pattern = re.compile(
        rf"^[ \t]*(?:(?:public|private|protected|static|async|readonly|override|abstract|get|set)[ \t]+)*\*?[ \t]*"
        rf"{n}[ \t]*(?:<[^>]*>)?[ \t]*(?=\()",
        re.M,
    )
    for m in pattern.finditer(text):
        end = _balanced_end(text, m.end())
        if end < 0:
            continue
        rest = text[end:end + 400].lstrip()
        if rest.startswith("{") or rest.startswith(":"):
            return True
    return False


LANGUAGE_RULES: Dict[str, Language] = {
    "python": Language("python", (".py",), _python_defines, ("_test.py",)),
    "typescript": Language("typescript", (".ts", ".mts", ".cts", ".js", ".mjs", ".cjs"), _ts_defines,
                           (".d.ts", ".d.mts", ".d.cts", ".test.ts", ".test.js", ".spec.ts")),
    "go": Language("go", (".go",), _go_defines, ("_test.go",)),
    "java": Language("java", (".java",), _java_defines, ("Test.java", "Tests.java")),
    "elixir": Language("elixir", (".ex",), _elixir_defines, ()),
}


def source_files(root: Path, lang: Language) -> List[Path]:
    """An SDK's source files: by suffix, outside test, build and dependency directories."""
    found: List[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("."))
        for f in sorted(filenames):
            if f.endswith(lang.suffixes) and not (lang.exclude and f.endswith(lang.exclude)):
                found.append(Path(dirpath) / f)
    return found


def undefined_names(names: Iterable[str], sources: Sequence[str], lang: Language) -> Set[str]:
    return {n for n in set(names) if not any(lang.defines(text, n) for text in sources)}


# --------------------------------------------------------------------------- the check


@dataclass
class Result:
    languages: List[str]
    status: Dict[str, str]  # language -> "ok" | "missing" | "errors"
    coverage: Dict[Op, Set[str]]
    internal: Set[Op]
    problems: List[str]
    warnings: List[str]
    ops: Dict[Op, str]

    @property
    def uncovered(self) -> List[Op]:
        return sorted(op for op in self.ops if not self.coverage.get(op) and op not in self.internal)


def check(doc: dict, sdk_dir: Path, languages: Sequence[str] = LANGUAGES) -> Result:
    ops = operations_of(doc)
    problems: List[str] = []
    warnings: List[str] = []
    coverage: Dict[Op, Set[str]] = {op: set() for op in ops}
    status: Dict[str, str] = {}
    present = [lang for lang in languages if (sdk_dir / lang).is_dir()]
    for lang in present:
        manifest_path = sdk_dir / lang / "operations.txt"
        if not manifest_path.is_file():
            status[lang] = "missing"
            problems.append(f"{lang}: no operations.txt (missing)")
            continue
        manifest = parse_manifest(manifest_path.read_text(encoding="utf-8"))
        where = f"sdk/{lang}/operations.txt"
        bad = [f"{where} {e}" for e in manifest.errors]
        warnings += [f"{where} {w}" for w in manifest.warnings]
        rules = LANGUAGE_RULES[lang]
        sources = [p.read_text(encoding="utf-8", errors="replace") for p in source_files(sdk_dir / lang, rules)]
        missing = undefined_names((e.name for e in manifest.entries), sources, rules)
        seen: Set[Tuple[Op, str]] = set()
        for e in manifest.entries:
            if e.op not in ops:
                bad.append(f"{where} line {e.line}: {e.method} {e.path} is not a route of the OpenAPI document")
                continue
            if e.name in missing:
                bad.append(f"{where} line {e.line}: {e.symbol}: no definition of {e.name!r} in the {lang} sources")
                continue
            if (e.op, e.symbol) in seen:
                warnings.append(f"{where} line {e.line}: {e.method} {e.path} {e.symbol} listed twice")
            seen.add((e.op, e.symbol))
            coverage[e.op].add(lang)
        status[lang] = "errors" if bad else "ok"
        problems += bad
    internal: Set[Op] = set()
    internal_path = sdk_dir / "internal-routes.txt"
    if internal_path.is_file():
        routes, errors = parse_routes(internal_path.read_text(encoding="utf-8"))
        problems += [f"sdk/internal-routes.txt {e}" for e in errors]
        for n, op in routes:
            if op not in ops:
                problems.append(f"sdk/internal-routes.txt line {n}: {op[0]} {op[1]} is not a route of the OpenAPI document")
            internal.add(op)
    result = Result(present, status, coverage, internal, problems, warnings, ops)
    for op in result.uncovered:
        problems.append(f"{op[0]} {ops[op]}: no SDK covers it and sdk/internal-routes.txt does not list it")
    return result


def table(result: Result) -> str:
    """The route × language table: ✓ where an SDK covers a route."""
    langs = result.languages
    rows = sorted(result.ops, key=lambda op: (result.ops[op], METHODS.index(op[0])))
    width = max([len(f"{m} {result.ops[(m, p)]}") for m, p in rows] + [5])
    head = "route".ljust(width) + "  " + "  ".join(langs)
    lines = [head, "-" * len(head)]
    for op in rows:
        cells = ["✓".center(len(lang)) if lang in result.coverage.get(op, ()) else " " * len(lang) for lang in langs]
        note = "  internal" if op in result.internal else ""
        if not result.coverage.get(op) and op not in result.internal:
            note = "  UNCOVERED"
        lines.append(f"{op[0]} {result.ops[op]}".ljust(width) + "  " + "  ".join(cells) + note)
    return "\n".join(lines)


def summary(result: Result) -> str:
    per = ", ".join(
        f"{lang} {sum(1 for op in result.ops if lang in result.coverage.get(op, ()))}"
        + ("" if result.status.get(lang) == "ok" else f" ({result.status.get(lang)})")
        for lang in result.languages
    )
    covered = sum(1 for op in result.ops if result.coverage.get(op))
    internal_only = sum(1 for op in result.ops if op in result.internal and not result.coverage.get(op))
    absent = [lang for lang in LANGUAGES if lang not in result.languages]
    return (
        f"conformance: {len(result.ops)} operations, {covered} covered by an SDK, "
        f"{len(result.internal & set(result.ops))} listed internal ({internal_only} of them covered by none), "
        f"{len(result.uncovered)} uncovered; per SDK: {per or 'none'}"
        + (f"; no directory: {', '.join(absent)}" if absent else "")
        + f"; {len(result.problems)} problem(s)"
    )


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--openapi", metavar="FILE", help="read the OpenAPI document from FILE instead of a server")
    ap.add_argument("--bin", default=os.environ.get("CELLA_BIN") or str(HERE.parent / "target" / "debug" / "cella"),
                    help="the server binary started for the document (default $CELLA_BIN)")
    ap.add_argument("--sdk-dir", default=str(HERE), help="the directory of the SDKs (default: this script's)")
    args = ap.parse_args(argv)
    try:
        if args.openapi:
            doc = json.loads(Path(args.openapi).read_text(encoding="utf-8"))
        else:
            doc = fetch_openapi(args.bin)
    except (OSError, ValueError, RuntimeError) as exc:
        print(f"conformance: cannot get the OpenAPI document: {exc}", file=sys.stderr)
        return 2
    result = check(doc, Path(args.sdk_dir))
    print(table(result))
    for w in result.warnings:
        print(f"warning: {w}")
    for p in result.problems:
        print(f"problem: {p}")
    print(summary(result))
    return 1 if result.problems else 0


if __name__ == "__main__":
    sys.exit(main())
