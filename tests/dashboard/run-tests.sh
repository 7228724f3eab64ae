#!/usr/bin/env bash
# The dashboard's browser suite: Playwright for Python (from PyPI, in a virtualenv) driving
# Debian's chromium against a real Cella server.
#
#   CELLA_BIN=target/debug/cella tests/dashboard/run-tests.sh [pytest args]
#
# - CELLA_BIN: the server binary (default target/debug/cella). Run as root, like the server.
# - DASHBOARD_SCREENSHOTS: where the screenshots of each page go (default
#   target/dashboard-screenshots of the repository).
# - CHROMIUM: the browser (default /usr/bin/chromium; on Debian: apt-get install chromium).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
python="${PYTHON:-/usr/bin/python3}"
export CELLA_BIN="${CELLA_BIN:-$repo/target/debug/cella}"
export DASHBOARD_SCREENSHOTS="${DASHBOARD_SCREENSHOTS:-$repo/target/dashboard-screenshots}"
export PYTHONDONTWRITEBYTECODE=1

if [ "$(id -u)" != 0 ]; then
    echo "run-tests.sh: the Cella server must run as root" >&2
    exit 1
fi
if [ ! -x "$CELLA_BIN" ]; then
    echo "run-tests.sh: no server binary at $CELLA_BIN (set CELLA_BIN to target/debug/cella)" >&2
    exit 1
fi
if [ ! -x "${CHROMIUM:-/usr/bin/chromium}" ]; then
    echo "run-tests.sh: no chromium at ${CHROMIUM:-/usr/bin/chromium} (on Debian: apt-get install chromium)" >&2
    exit 1
fi

work="$(mktemp -d -t cella-dashboard-py.XXXXXX)"
trap 'rm -rf "$work"' EXIT
if ! "$python" -m venv "$work/venv" >/dev/null 2>&1; then
    echo "run-tests.sh: '$python -m venv' failed (on Debian: apt-get install python3-venv)" >&2
    exit 1
fi
venv_py="$work/venv/bin/python"

echo "== installing playwright, httpx and pytest into a virtualenv"
"$venv_py" -m pip install --quiet --disable-pip-version-check playwright httpx pytest

echo "== dashboard browser tests (server: $CELLA_BIN, screenshots: $DASHBOARD_SCREENSHOTS)"
cd "$here"
timeout -k 30 1200 "$venv_py" -m pytest -q -ra -p no:cacheprovider "$@" .
