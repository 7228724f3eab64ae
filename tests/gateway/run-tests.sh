#!/usr/bin/env bash
# The model gateway's tests with the official `openai` and `anthropic` Python packages, against
# a real Cella server whose upstream is the stand-in model server of standin.py (this machine
# reaches no model provider).
#
#   CELLA_BIN=target/debug/cella tests/gateway/run-tests.sh [pytest args]
#
# - CELLA_BIN: the server binary (default target/debug/cella). Run as root, like the server.
# - PYTHON: the interpreter the virtualenv is made from (default /usr/bin/python3: the one
#   sandboxes run, so the packages installed for the host also work inside a sandbox).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
python="${PYTHON:-/usr/bin/python3}"
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

work="$(mktemp -d -t cella-gateway-py.XXXXXX)"
trap 'rm -rf "$work"' EXIT
if ! "$python" -m venv "$work/venv" >/dev/null 2>&1; then
    echo "run-tests.sh: '$python -m venv' failed (on Debian: apt-get install python3-venv)" >&2
    exit 1
fi
venv_py="$work/venv/bin/python"

echo "== installing openai, anthropic, httpx and pytest into a virtualenv"
"$venv_py" -m pip install --quiet --disable-pip-version-check openai anthropic httpx pytest hypothesis

echo "== gateway tests (server: $CELLA_BIN)"
cd "$here"
timeout -k 30 900 "$venv_py" -m pytest -q -ra -p no:cacheprovider "$@" .
