#!/usr/bin/env bash
# Cella's MCP server with MCP clients no one here wrote: the official Python SDK (`mcp` from
# PyPI) over streamable HTTP and over `cella mcp --stdio`, and the official TypeScript SDK
# (@modelcontextprotocol/sdk from npm, pinned by ts/package-lock.json) over streamable HTTP.
#
#   CELLA_BIN=target/debug/cella tests/mcp/run-tests.sh [pytest args]
#
# - CELLA_BIN: the server binary (default target/debug/cella). Run as root, like the server.
# - PYTHON: the interpreter the virtualenv is made from (default /usr/bin/python3).
# - CELLA_MCP_NODE_CACHE: where the TypeScript SDK is installed (default
#   /var/tmp/cella-mcp-node; reinstalled when the lock file changes), outside the clone.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
python="${PYTHON:-/usr/bin/python3}"
export CELLA_BIN="${CELLA_BIN:-$repo/target/debug/cella}"
case "$CELLA_BIN" in /*) ;; *) CELLA_BIN="$PWD/$CELLA_BIN" ;; esac
export PYTHONDONTWRITEBYTECODE=1
unset CELLA_SERVER CELLA_API_KEY

if [ "$(id -u)" != 0 ]; then
    echo "run-tests.sh: the Cella server must run as root" >&2
    exit 1
fi
if [ ! -x "$CELLA_BIN" ]; then
    echo "run-tests.sh: no server binary at $CELLA_BIN (set CELLA_BIN to target/debug/cella)" >&2
    exit 1
fi
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    echo "run-tests.sh: node (20 or newer) and npm are needed for the TypeScript SDK's test" >&2
    exit 1
fi

work="$(mktemp -d -t cella-mcp.XXXXXX)"
trap 'rm -rf "$work"' EXIT
if ! "$python" -m venv "$work/venv" >/dev/null 2>&1; then
    echo "run-tests.sh: '$python -m venv' failed (on Debian: apt-get install python3-venv)" >&2
    exit 1
fi
venv_py="$work/venv/bin/python"

echo "== installing mcp, httpx, anyio and pytest into a virtualenv"
"$venv_py" -m pip install --quiet --disable-pip-version-check mcp httpx anyio pytest

echo "== installing @modelcontextprotocol/sdk from ts/package-lock.json"
cache="${CELLA_MCP_NODE_CACHE:-/var/tmp/cella-mcp-node}"
mkdir -p "$cache"
if ! cmp -s "$here/ts/package-lock.json" "$cache/package-lock.json" || [ ! -d "$cache/node_modules" ]; then
    rm -rf "$cache/node_modules"
    cp "$here/ts/package.json" "$here/ts/package-lock.json" "$cache/"
    (cd "$cache" && npm ci --no-audit --no-fund --loglevel=error)
fi
cp "$here/ts/test.mjs" "$cache/test.mjs"

echo "== MCP tests with the Python SDK (server: $CELLA_BIN)"
cd "$here"
timeout -k 30 1200 "$venv_py" -m pytest -q -ra -p no:cacheprovider "$@" .

echo "== MCP tests with the TypeScript SDK"
cd "$cache"
timeout -k 30 600 "$venv_py" "$repo/sdk/python/tests/cella_server.py" node --test test.mjs
