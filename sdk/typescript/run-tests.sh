#!/usr/bin/env bash
# Tests of the TypeScript SDK, for CI: `bash sdk/typescript/run-tests.sh`.
#
# Needs Node.js 20 or newer (with npm) and a built server: CELLA_BIN (default
# target/debug/cella). Installs the pinned TypeScript compiler from package-lock.json (`npm
# ci`, its cache under /var/tmp), builds the package (dist/esm and dist/cjs, strict), checks
# its public types against the OpenAPI document of a server started from CELLA_BIN, then runs
# the example and the node tests. Every test file and the example start their own server
# (free port, temporary data directory, random key) and destroy every sandbox they made.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"

export CELLA_BIN="${CELLA_BIN:-$(cd "$(dirname "$0")/../.." && pwd)/target/debug/cella}"
case "$CELLA_BIN" in /*) ;; *) CELLA_BIN="$PWD/$CELLA_BIN" ;; esac
if [ ! -x "$CELLA_BIN" ]; then
    echo "run-tests.sh: no cella binary at $CELLA_BIN (set CELLA_BIN to target/debug/cella)" >&2
    exit 1
fi
cd "$here"
for tool in node npm; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "run-tests.sh: $tool (Node.js 20 or newer) is not installed" >&2
        exit 1
    fi
done
major="$(node -p 'process.versions.node.split(".")[0]')"
if [ "$major" -lt 20 ]; then
    echo "run-tests.sh: node $(node --version) is too old; the SDK needs 20 or newer" >&2
    exit 1
fi
# The SDK's own environment must not leak into the tests.
unset CELLA_SERVER CELLA_API_KEY

echo "== npm ci (typescript, pinned in package-lock.json)"
timeout 300 npm ci --cache "${CELLA_NPM_CACHE:-/var/tmp/cella-npm-cache}" --prefer-offline --no-audit --no-fund

echo "== build: tsc (strict) into dist/esm and dist/cjs"
node scripts/build.mjs

echo "== types: the SDK's objects against the server's OpenAPI document; the API as used, the README's ts blocks"
timeout 120 node test/types/generate.mjs
node test/types/readme-blocks.mjs
node_modules/.bin/tsc -p test/types/tsconfig.json

echo "== example: examples/typescript/csv_pandas.mjs"
timeout 180 node test/run-example.mjs

echo "== node --test (sdk/typescript/test)"
# Node 20 and 21 have their WebSocket class (for sandbox.pty) behind a flag.
flags=()
if [ "$major" -lt 22 ]; then flags+=(--experimental-websocket); fi
# Two test files at a time (each has its own server) where node takes the option.
if node --test-concurrency=2 -e 0 >/dev/null 2>&1; then flags+=(--test-concurrency=2); fi
timeout 600 node "${flags[@]}" --test --test-timeout=180000 test/*.test.js
