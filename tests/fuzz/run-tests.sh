#!/usr/bin/env bash
# The whole HTTP API fuzzed from its own OpenAPI document with Schemathesis (from PyPI): every
# operation gets generated bodies, parameters and headers, valid and broken, and the check is
# that the server never answers 5xx. Runs against a real server with real sandboxes.
#
#   CELLA_BIN=target/debug/cella tests/fuzz/run-tests.sh
#
# - CELLA_BIN: the server binary (default target/debug/cella). A server is started on a free
#   port with a temporary data directory and a random operator key, and stopped at the end
#   (every sandbox it made is destroyed first).
# - FUZZ_MAX_EXAMPLES: cases per operation and phase (default 25).
# - The virtualenv lives in $CELLA_FUZZ_VENV (default /var/tmp/cella-fuzz-venv, reused).
#
# Exits non-zero when any response was a 5xx. The last line sums the run up.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
export CELLA_BIN="${CELLA_BIN:-$repo/target/debug/cella}"
venv="${CELLA_FUZZ_VENV:-/var/tmp/cella-fuzz-venv}"
max_examples="${FUZZ_MAX_EXAMPLES:-25}"

if [ "$(id -u)" != 0 ]; then
    echo "run-tests.sh: the Cella server must run as root" >&2
    exit 1
fi
if [ ! -x "$venv/bin/schemathesis" ]; then
    echo "== installing schemathesis into $venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check 'schemathesis>=4,<5'
fi

work="$(mktemp -d -t cella-fuzz.XXXXXX)"
port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
key="fuzz-$(head -c 18 /dev/urandom | od -An -tx1 | tr -d ' \n')"
base="http://127.0.0.1:$port"
CELLA_BOOTSTRAP_KEY="$key" "$CELLA_BIN" serve --listen "127.0.0.1:$port" --data-dir "$work/data" \
    >"$work/server.log" 2>&1 &
server=$!

cleanup() {
    # Destroy what the run made, then stop the server (SIGTERM: a clean shutdown).
    if kill -0 "$server" 2>/dev/null; then
        python3 - "$base" "$key" <<'PY' || true
import json, sys, urllib.request
base, key = sys.argv[1], sys.argv[2]
def call(method, path):
    req = urllib.request.Request(base + path, method=method, headers={"Authorization": "Bearer " + key})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.load(r) if method == "GET" else None
for kind in ("sandboxes", "snapshots"):
    try:
        for item in call("GET", f"/api/v1/{kind}?limit=1000")["data"]:
            try:
                call("DELETE", f"/api/v1/{kind}/{item['id']}")
            except Exception:
                pass
    except Exception as e:
        print(f"fuzz cleanup: listing {kind} failed: {e}", file=sys.stderr)
PY
        kill -TERM "$server" 2>/dev/null || true
        wait "$server" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT

for _ in $(seq 1 100); do
    curl -fsS "$base/healthz" >/dev/null 2>&1 && break
    sleep 0.2
done

echo "== schemathesis against $base (server: $CELLA_BIN)"
status=0
# Revoking keys is left out: the fuzzer finds the operator key's id in listings and would revoke
# the very key it runs with (allowed; the key suites test revocation).
SCHEMATHESIS_HOOKS=hooks PYTHONPATH="$here" timeout -k 30 900 "$venv/bin/schemathesis" run "$base/api/v1/openapi.json" \
    -H "Authorization: Bearer $key" \
    --checks not_a_server_error \
    --phases examples,coverage,fuzzing \
    --max-examples "$max_examples" \
    --workers 1 \
    --seed 1 \
    --report junit --report-junit-path "$work/junit.xml" \
    --warnings off \
    --exclude-path '/api/v1/api-keys/{id}' \
    "$@" || status=$?

if grep -q 'panicked' "$work/server.log"; then
    echo "the server panicked during the run:" >&2
    grep -A3 'panicked' "$work/server.log" >&2
    status=1
fi

python3 - "$work/junit.xml" "$status" <<'PY'
import sys
import xml.etree.ElementTree as ET
ops = failed = 0
try:
    root = ET.parse(sys.argv[1]).getroot()
    for suite in root.iter("testsuite"):
        ops += int(suite.get("tests", 0))
        failed += int(suite.get("failures", 0)) + int(suite.get("errors", 0))
except (OSError, ET.ParseError):
    failed += 1
print(f"api-fuzz: {ops} operations, {failed} failed, exit {sys.argv[2]}")
PY
exit "$status"
