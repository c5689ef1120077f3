#!/usr/bin/env bash
# Apache Pulsar standalone from Maven Central (no tarball), by hand:
#   bash scripts/pulsar.sh fetch          resolve the pinned release (scripts/pulsar/pom.xml) into
#                                         .cache/pulsar/<version>/lib (STREAMOFFLOAD_PULSAR_LIB: elsewhere)
#   bash scripts/pulsar.sh start [ARGS]   fetch when missing, then run it in the foreground on free loopback
#                                         ports until Ctrl-C: `streamoffload broker --pulsar ARGS`
# The tests (marker `pulsar`) and the benches (`--broker pulsar`) start their own from the same jars.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
POM="$ROOT/scripts/pulsar/pom.xml"
VERSION="$(sed -n 's|.*<pulsar.version>\(.*\)</pulsar.version>.*|\1|p' "$POM")"
LIB="${STREAMOFFLOAD_PULSAR_LIB:-$ROOT/.cache/pulsar/$VERSION/lib}"

fetch() {
    if [ -f "$LIB/pulsar-broker-$VERSION.jar" ]; then
        return 0
    fi
    if ! command -v mvn >/dev/null 2>&1; then
        echo "streamoffload: Maven ('mvn') is needed to fetch Apache Pulsar $VERSION; Debian: apt-get install -y maven" >&2
        return 1
    fi
    echo "== fetching Apache Pulsar $VERSION from Maven Central into $LIB"
    # Into a fresh directory first, renamed when complete: a broken download never looks like a fetched release.
    local partial="$LIB.partial.$$"
    rm -rf "$partial"
    mkdir -p "$(dirname "$LIB")"
    # Maven's output goes to a log, shown only on failure.
    mkdir -p "$ROOT/var/logs"
    local log="$ROOT/var/logs/pulsar-fetch.log"
    if ! mvn -B -ntp -Dstyle.color=never -f "$POM" dependency:copy-dependencies -DincludeScope=runtime \
        -DoutputDirectory="$partial" -Dpulsar.version="$VERSION" >"$log" 2>&1; then
        rm -rf "$partial"
        tail -n 40 "$log" >&2
        echo "streamoffload: resolving Apache Pulsar $VERSION from Maven Central failed (log: $log)" >&2
        return 1
    fi
    rm -rf "$LIB"
    mv "$partial" "$LIB"
    echo "== Apache Pulsar $VERSION: $(find "$LIB" -name '*.jar' | wc -l) jars, $(du -sh "$LIB" | cut -f1)"
}

case "${1:-}" in
    fetch)
        fetch
        ;;
    start)
        shift
        fetch
        PY="${PY:-$ROOT/.venv/bin/python}"
        STREAMOFFLOAD_PULSAR_LIB="$LIB" exec "$PY" -m streamoffload broker --pulsar "$@"
        ;;
    *)
        sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//' >&2
        exit 2
        ;;
esac
