#!/usr/bin/env bash
# The reliability suites: churn and soak, load, faults from outside the server
# (crates/cella-cli/tests/{churn,load,faults}.rs). Runs as root (the tests start real sandboxes).
#
#   bash scripts/reliability.sh                 the short forms (what CI runs), debug build
#   bash scripts/reliability.sh --long          the long forms, release build: 1,000 churn cycles,
#                                               a 30-minute soak, 500 sandboxes held at once
#   bash scripts/reliability.sh --long --soak-minutes 2   a shorter soak
#   bash scripts/reliability.sh --only churn    one suite (churn, load or faults)
#
# Prints each suite's figures (the lines its tests print, prefixed churn:/soak:/load:/faults:).
set -euo pipefail
cd "$(dirname "$0")/.."

long=0
soak_minutes=""
only=""
while [ $# -gt 0 ]; do
  case "$1" in
    --long) long=1 ;;
    --soak-minutes) soak_minutes="$2"; shift ;;
    --only) only="$2"; shift ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
  shift
done

profile=()
if [ "$long" = 1 ]; then
  profile=(--release)
  export CELLA_RELIABILITY_LONG=1
fi
if [ -n "$soak_minutes" ]; then
  export CELLA_SOAK_MINUTES="$soak_minutes"
fi

suites=(churn load faults)
if [ -n "$only" ]; then suites=("$only"); fi

args=()
for t in "${suites[@]}"; do args+=(--test "$t"); done

cargo test "${profile[@]}" -p cella-cli "${args[@]}" --no-run
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
for t in "${suites[@]}"; do
  echo "== $t"
  if cargo test "${profile[@]}" -p cella-cli --test "$t" -- --nocapture >"$log.$t" 2>&1; then
    echo "$t: passed"
  else
    echo "$t: FAILED"
    status=1
  fi
  grep -E '^test .* \.\.\. |^test result' "$log.$t" || true
  cat "$log.$t" >>"$log"
  rm -f "$log.$t"
done
echo
echo "== figures"
grep -E '^(churn|soak|load|faults):' "$log" || true
if [ "$status" != 0 ]; then
  echo "== failures"
  grep -E -A20 '^---- .* stdout ----|panicked at' "$log" | head -n 200 || true
fi
exit "$status"
