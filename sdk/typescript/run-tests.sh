#!/usr/bin/env bash
# Tests of the JavaScript SDK, for CI: `bash sdk/typescript/run-tests.sh`.
#
# Needs Node.js 20 or newer and a built server: CELLA_BIN (default target/debug/cella). Every
# test file and the example start their own server from it (free port, temporary data
# directory, random key) and destroy every sandbox they made. Downloads nothing.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"

export CELLA_BIN="${CELLA_BIN:-$(cd "$(dirname "$0")/../.." && pwd)/target/debug/cella}"
case "$CELLA_BIN" in /*) ;; *) CELLA_BIN="$PWD/$CELLA_BIN" ;; esac
if [ ! -x "$CELLA_BIN" ]; then
    echo "run-tests.sh: no cella binary at $CELLA_BIN (set CELLA_BIN to target/debug/cella)" >&2
    exit 1
fi
cd "$here"
if ! command -v node >/dev/null 2>&1; then
    echo "run-tests.sh: node (20 or newer) is not installed" >&2
    exit 1
fi
major="$(node -p 'process.versions.node.split(".")[0]')"
if [ "$major" -lt 20 ]; then
    echo "run-tests.sh: node $(node --version) is too old; the SDK needs 20 or newer" >&2
    exit 1
fi
# The SDK's own environment must not leak into the tests.
unset CELLA_SERVER CELLA_API_KEY

echo "== example: examples/typescript/csv_pandas.mjs"
timeout 180 node test/run-example.mjs

echo "== node --test (sdk/typescript/test)"
timeout 600 node --test --test-timeout=120000 test/*.test.js
