#!/usr/bin/env bash
# Tests of the Java SDK against a real Cella server, then the example.
#
#   CELLA_BIN=target/debug/cella sdk/java/run-tests.sh [-Dtest=FilesTest]
#
# - CELLA_BIN: the server binary (default target/debug/cella). The tests start their own
#   servers (free port, temporary data directory, random key) and stop them at the end.
#   Run as root, like the server itself.
# - Java 17 and Maven (Debian: openjdk-17-jdk-headless, maven). The build is offline (-o), against
#   Debian's Maven repository /usr/share/maven-repo (packages libjackson2-databind-java, junit5,
#   libmaven-resources-plugin-java, libmaven-compiler-plugin-java, libmaven-jar-plugin-java,
#   libsurefire-java): see settings-offline.xml. What Maven reads from it is cached in
#   CELLA_MAVEN_REPO (default /var/tmp/cella-java-m2), outside the clone.
# - Extra arguments go to Maven (e.g. -Dtest=FilesTest).
#
# Then the example and the README's first example run, each against a server of its own.
# Exits non-zero when a test or an example fails. The last line sums both up.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
export CELLA_BIN="${CELLA_BIN:-$repo/target/debug/cella}"
export CELLA_MAVEN_REPO="${CELLA_MAVEN_REPO:-/var/tmp/cella-java-m2}"

if [ "$(id -u)" != 0 ]; then
    echo "run-tests.sh: the Cella server must run as root" >&2
    exit 1
fi
if [ ! -x "$CELLA_BIN" ]; then
    echo "run-tests.sh: no server binary at $CELLA_BIN (set CELLA_BIN to target/debug/cella)" >&2
    exit 1
fi
for tool in java mvn; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "run-tests.sh: $tool is missing (on Debian: apt-get install openjdk-17-jdk-headless maven)" >&2
        exit 1
    fi
done
CELLA_BIN="$(cd "$(dirname "$CELLA_BIN")" && pwd)/$(basename "$CELLA_BIN")"
mkdir -p "$CELLA_MAVEN_REPO"

mvn_args=(-o -B -ntp -Daether.offline.protocols=file -s "$here/settings-offline.xml" -f "$here/pom.xml")

echo "== build and tests (server: $CELLA_BIN)"
status=0
rm -rf "$here/target/surefire-reports"
(cd "$here" && timeout -k 30 900 mvn "${mvn_args[@]}" test "$@") || status=$?

echo "== examples: examples/java/CsvPandas.java, then the README's first example (one server)"
cp="$here/target/classes:$here/target/test-classes"
for jar in "$CELLA_MAVEN_REPO"/com/fasterxml/jackson/core/*/*/*.jar; do
    cp="$cp:$jar"
done
work="$(mktemp -d -t cella-sdk-java.XXXXXX)"
trap 'rm -rf "$work"' EXIT
awk '/^```java$/ {n++; if (n == 1) {on = 1; next}} on && /^```$/ {exit} on {print}' "$here/README.md" > "$work/Quickstart.java"
echo "1 1" > "$work/rc"
launcher=0
(cd "$work" && timeout -k 30 400 java -cp "$cp" io.cella.CellaServer bash -c '
    java -cp "$1" "$2"; a=$?
    echo "== the README'"'"'s first example"
    java -cp "$1" "$3"; b=$?
    echo "$a $b" > "$4"' - "$cp" "$repo/examples/java/CsvPandas.java" "$work/Quickstart.java" "$work/rc") || launcher=$?
read -r example readme < "$work/rc"
if [ "$launcher" != 0 ] && [ "$example" = 0 ] && [ "$readme" = 0 ]; then
    echo "the examples' server reported a failure (exit $launcher: sandboxes left behind?)" >&2
    example=$launcher
fi
if [ "$example" != 0 ]; then
    echo "the example failed (exit $example)" >&2
fi
if [ "$readme" != 0 ]; then
    echo "the README's first example failed (exit $readme)" >&2
fi

passed=0 failed=0 skipped=0
for xml in "$here"/target/surefire-reports/TEST-*.xml; do
    [ -f "$xml" ] || continue
    line="$(grep -m1 '<testsuite' "$xml")"
    get() { sed -n "s/.* $1=\"\([0-9]*\)\".*/\1/p" <<<"$line"; }
    t="$(get tests)" f="$(get failures)" e="$(get errors)" s="$(get skipped)"
    passed=$((passed + t - f - e - s)) failed=$((failed + f + e)) skipped=$((skipped + s))
done
if [ "$passed" = 0 ] && [ "$failed" = 0 ]; then
    failed=$((failed + 1))  # Maven did not get as far as running the tests
fi
for rc in "$example" "$readme"; do
    if [ "$rc" = 0 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
done
echo "java-sdk: $passed passed, $failed failed, $skipped skipped"

if [ "$status" != 0 ] || [ "$example" != 0 ] || [ "$readme" != 0 ]; then
    exit 1
fi
