#!/usr/bin/env bash
# Tests of the Python SDK against a real Cella server, then the example.
#
#   CELLA_BIN=target/debug/cella sdk/python/run-tests.sh
#
# - CELLA_BIN: the server binary (default target/debug/cella). The tests start their own
#   servers (free port, temporary data directory, random key) and stop them at the end.
#   Run as root, like the server itself.
# - PYTHON: the interpreter (default python3; 3.9 or newer). A virtualenv is made in a
#   temporary directory and the package is installed into it with pytest, from PyPI.
#   Debian's python3 needs the `python3-venv` package for that (installed here when missing
#   and running as root with apt-get).
# - Extra arguments go to pytest (e.g. -k files -x).
#
# Exits non-zero when a test or the example fails. The last line sums both up.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
python="${PYTHON:-python3}"
export CELLA_BIN="${CELLA_BIN:-$repo/target/debug/cella}"
export PYTHONDONTWRITEBYTECODE=1

if [ "$(id -u)" != 0 ]; then
    echo "run-tests.sh: the Cella server must run as root" >&2
    exit 1
fi
if [ ! -x "$CELLA_BIN" ]; then
    echo "run-tests.sh: no server binary at $CELLA_BIN (set CELLA_BIN to target/debug/cella)" >&2
    exit 1
fi
if ! "$python" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 9) else 1)'; then
    echo "run-tests.sh: $python is older than Python 3.9" >&2
    exit 1
fi

work="$(mktemp -d -t cella-sdk-py.XXXXXX)"
trap 'rm -rf "$work"' EXIT

if ! "$python" -m venv "$work/venv" >/dev/null 2>&1; then
    if [ -x /usr/bin/apt-get ] && [ "$("$python" -c 'import sys; print(sys.executable)')" = /usr/bin/python3 ]; then
        echo "run-tests.sh: installing python3-venv" >&2
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
        rm -rf "$work/venv"
        "$python" -m venv "$work/venv"
    else
        echo "run-tests.sh: '$python -m venv' failed (on Debian: apt-get install python3-venv)" >&2
        "$python" -m venv "$work/venv"
    fi
fi
venv_py="$work/venv/bin/python"

echo "== installing the SDK and pytest into a virtualenv"
"$venv_py" -m pip install --quiet --disable-pip-version-check "$here[test]"

echo "== tests (server: $CELLA_BIN)"
status=0
cd "$here"
timeout -k 30 600 "$venv_py" -m pytest -q -ra -p no:cacheprovider \
    --junitxml="$work/junit.xml" "$@" tests || status=$?

echo "== example: examples/python/csv_pandas.py"
example=0
(cd "$work" && timeout -k 30 300 "$venv_py" "$here/tests/cella_server.py" \
    "$venv_py" "$repo/examples/python/csv_pandas.py") || example=$?
if [ "$example" != 0 ]; then
    echo "the example failed (exit $example)" >&2
fi

"$venv_py" - "$work/junit.xml" "$example" <<'EOF'
import sys
import xml.etree.ElementTree as ET

passed = failed = skipped = 0
try:
    root = ET.parse(sys.argv[1]).getroot()
    for suite in root.iter("testsuite"):
        total = int(suite.get("tests", 0))
        f = int(suite.get("failures", 0)) + int(suite.get("errors", 0))
        s = int(suite.get("skipped", 0))
        passed += total - f - s
        failed += f
        skipped += s
except (OSError, ET.ParseError):
    failed += 1  # pytest did not get as far as writing its report
if sys.argv[2] == "0":
    passed += 1
else:
    failed += 1
print(f"python-sdk: {passed} passed, {failed} failed, {skipped} skipped")
EOF

if [ "$status" != 0 ] || [ "$example" != 0 ]; then
    exit 1
fi
