#!/usr/bin/env bash
# Checks that the committed dist/ is exactly what the sources in web/ build to (the built assets
# are never edited by hand): `npm ci` and `npm run build` into a temporary directory, then a
# byte-for-byte comparison with dist/.
#
#   crates/cella-dashboard/check-dist.sh          # check (CI)
#   crates/cella-dashboard/check-dist.sh --write  # rebuild dist/ in place
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
tmp="$(mktemp -d -t cella-dashboard-build.XXXXXX)"
trap 'rm -rf "$tmp"' EXIT

# A copy of the sources, so that the check never touches the work tree's node_modules.
mkdir -p "$tmp/web"
(cd "$here/web" && tar --exclude=node_modules -cf - .) | (cd "$tmp/web" && tar -xf -)
cd "$tmp/web"
npm ci --no-audit --no-fund --loglevel=error
npx tsc --noEmit
npx vite build --logLevel warn --outDir "$tmp/dist" --emptyOutDir

if [ "${1:-}" = "--write" ]; then
    rm -rf "$here/dist"
    cp -r "$tmp/dist" "$here/dist"
    echo "check-dist: dist/ rebuilt"
    exit 0
fi
if ! diff -r "$tmp/dist" "$here/dist" >"$tmp/diff.txt"; then
    echo "check-dist: crates/cella-dashboard/dist/ differs from a fresh build of web/:" >&2
    head -50 "$tmp/diff.txt" >&2
    echo "check-dist: run crates/cella-dashboard/check-dist.sh --write (or npm run build in web/) and commit dist/" >&2
    exit 1
fi
echo "check-dist: dist/ matches a fresh build of web/"
