#!/usr/bin/env bash
# Tests of the Go SDK against a real Cella server, then the example.
#
#   CELLA_BIN=target/debug/cella sdk/go/run-tests.sh [go test flags, e.g. -run Files]
#
# - CELLA_BIN: the server binary (default target/debug/cella). The tests start their own
#   servers (free port, temporary data directory, random key) and stop them at the end.
#   Run as root, like the server itself.
# - GO: the go command (default go; Go 1.19 or newer). The SDK uses the standard library only,
#   so nothing is downloaded: GOPROXY=off. The build cache lives outside the clone
#   (GOCACHE, default /var/tmp/cella-go-cache) so that repeated runs reuse it.
#
# Exits non-zero when gofmt, go vet, a test or the example fails. The last line sums up.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
go="${GO:-go}"
export CELLA_BIN="${CELLA_BIN:-$repo/target/debug/cella}"
export GOFLAGS=-mod=mod GOPROXY=off GOSUMDB=off GOTOOLCHAIN=local
export GOCACHE="${GOCACHE:-/var/tmp/cella-go-cache}"
export GOPATH="${GOPATH:-/var/tmp/cella-go-path}"

if [ "$(id -u)" != 0 ]; then
    echo "run-tests.sh: the Cella server must run as root" >&2
    exit 1
fi
if [ ! -x "$CELLA_BIN" ]; then
    echo "run-tests.sh: no server binary at $CELLA_BIN (set CELLA_BIN to target/debug/cella)" >&2
    exit 1
fi
export CELLA_BIN="$(cd "$(dirname "$CELLA_BIN")" && pwd)/$(basename "$CELLA_BIN")"
if ! command -v "$go" >/dev/null 2>&1; then
    echo "run-tests.sh: no go command (on Debian: apt-get install golang-go)" >&2
    exit 1
fi

work="$(mktemp -d -t cella-sdk-go.XXXXXX)"
trap 'rm -rf "$work"' EXIT

cd "$here"
echo "== $("$go" version); gofmt and go vet"
checks=0
unformatted="$(gofmt -l . "$repo/examples/go")"
if [ -n "$unformatted" ]; then
    echo "not gofmt'ed: $unformatted" >&2
    checks=1
fi
"$go" vet ./... || checks=1
(cd "$repo/examples/go" && "$go" vet ./...) || checks=1

echo "== tests (server: $CELLA_BIN)"
status=0
timeout -k 30 600 "$go" test -count=1 -v -timeout 9m "$@" . 2>&1 | tee "$work/test.log" || status=$?

echo "== example: examples/go/quickstart"
example=0
(cd "$repo/examples/go" && "$go" build -o "$work/quickstart" ./quickstart) || example=$?
if [ "$example" = 0 ]; then
    timeout -k 30 300 "$go" run ./internal/testserver/run -- "$work/quickstart" || example=$?
fi
if [ "$example" != 0 ]; then
    echo "the example failed (exit $example)" >&2
fi

passed="$(grep -c -- '^--- PASS' "$work/test.log" || true)"
failed="$(grep -c -- '^--- FAIL' "$work/test.log" || true)"
skipped="$(grep -c -- '^--- SKIP' "$work/test.log" || true)"
if [ "$status" != 0 ] && [ "$failed" = 0 ]; then
    failed=1 # the suite did not get as far as its tests (the server did not start, a build error)
fi
if [ "$example" = 0 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
if [ "$checks" != 0 ]; then failed=$((failed + 1)); fi
echo "go-sdk: $passed passed, $failed failed, $skipped skipped"

if [ "$status" != 0 ] || [ "$example" != 0 ] || [ "$checks" != 0 ]; then
    exit 1
fi
