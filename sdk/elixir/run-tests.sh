#!/usr/bin/env bash
# Tests of the Elixir SDK against a real Cella server, then the example.
#
#   CELLA_BIN=target/debug/cella sdk/elixir/run-tests.sh [mix test arguments]
#
# - CELLA_BIN: the server binary (default target/debug/cella). The suite starts its own
#   servers (free port, temporary data directory, random key) and stops them at the end.
#   Run as root, like the server itself.
# - Needs Debian's elixir (1.14, with OTP's inets and ssl) and erlang-jiffy; no Hex: the
#   project has no dependencies. jiffy is on OTP's code path where Debian installs it
#   (/usr/lib/erlang/lib/jiffy-*); elsewhere set ERL_LIBS to the directory that holds it.
# - Build output and Mix's home go under /var/tmp (CELLA_ELIXIR_BUILD), outside the clone.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
export CELLA_BIN="${CELLA_BIN:-$repo/target/debug/cella}"

if [ "$(id -u)" != 0 ]; then
    echo "run-tests.sh: the Cella server must run as root" >&2
    exit 1
fi
if [ ! -x "$CELLA_BIN" ]; then
    echo "run-tests.sh: no server binary at $CELLA_BIN (set CELLA_BIN to target/debug/cella)" >&2
    exit 1
fi
command -v mix >/dev/null || { echo "run-tests.sh: no mix (apt-get install elixir erlang-jiffy)" >&2; exit 1; }

build="${CELLA_ELIXIR_BUILD:-/var/tmp/cella-elixir-build}"
mkdir -p "$build"
export MIX_HOME="$build/mix" HEX_OFFLINE=1 MIX_ENV=test MIX_BUILD_PATH="$build/test"
export ERL_LIBS="${ERL_LIBS:-}"
cd "$here"

echo "== tests (server: $CELLA_BIN)"
status=0
timeout -k 30 900 mix test "$@" || status=$?

echo "== example: examples/elixir/hello.exs"
example=0
(timeout -k 30 300 mix run "$repo/examples/elixir/with_server.exs" "$repo/examples/elixir/hello.exs") || example=$?
if [ "$example" != 0 ]; then
    echo "the example failed (exit $example)" >&2
fi

if [ "$status" != 0 ] || [ "$example" != 0 ]; then
    echo "elixir-sdk: FAILED (tests exit $status, example exit $example)"
    exit 1
fi
echo "elixir-sdk: tests and example passed"
