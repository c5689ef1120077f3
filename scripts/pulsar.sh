#!/usr/bin/env bash
# Apache Pulsar standalone from Maven Central (no tarball), by hand:
#   bash scripts/pulsar.sh fetch          resolve the pinned release (scripts/pulsar/pom.xml) into
#                                         .cache/pulsar/<version>/lib (STREAMOFFLOAD_PULSAR_LIB: elsewhere)
#   bash scripts/pulsar.sh start [ARGS]   fetch when missing, then run it in the foreground on free loopback
#                                         ports until Ctrl-C: `streamoffload broker --pulsar ARGS`
# The tests (marker `pulsar`) and the benches (`--broker pulsar`) start their own from the same jars.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/_maven_fetch.sh"
POM="$ROOT/scripts/pulsar/pom.xml"
VERSION="$(sed -n 's|.*<pulsar.version>\(.*\)</pulsar.version>.*|\1|p' "$POM")"
LIB="${STREAMOFFLOAD_PULSAR_LIB:-$ROOT/.cache/pulsar/$VERSION/lib}"

fetch() {
    maven_fetch "Apache Pulsar $VERSION" "$POM" "$LIB" "pulsar-broker-$VERSION.jar" pulsar-fetch.log -Dpulsar.version="$VERSION"
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
