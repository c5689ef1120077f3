#!/usr/bin/env bash
# Apache Iceberg's REST catalog test server (RESTCatalogServer, from iceberg-open-api's test fixtures) from Maven
# Central, by hand:
#   bash scripts/iceberg_rest.sh fetch            resolve the pinned release (scripts/iceberg_rest/pom.xml) into
#                                                 .cache/iceberg_rest/<version>/lib (STREAMOFFLOAD_ICEBERG_REST_LIB:
#                                                 elsewhere)
#   bash scripts/iceberg_rest.sh start DIR [PORT] fetch when missing, then serve a catalog whose warehouse and
#                                                 SQLite database are under DIR, on PORT (default 8181), in the
#                                                 foreground until Ctrl-C: --catalog rest+http://127.0.0.1:PORT
# The REST catalog tests (tests/fixtures/iceberg_rest.py) start their own from the same jars.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
POM="$ROOT/scripts/iceberg_rest/pom.xml"
VERSION="$(sed -n 's|.*<iceberg.version>\(.*\)</iceberg.version>.*|\1|p' "$POM")"
LIB="${STREAMOFFLOAD_ICEBERG_REST_LIB:-$ROOT/.cache/iceberg_rest/$VERSION/lib}"

fetch() {
    if [ -f "$LIB/iceberg-open-api-$VERSION-test-fixtures.jar" ]; then
        return 0
    fi
    if ! command -v mvn >/dev/null 2>&1; then
        echo "streamoffload: Maven ('mvn') is needed to fetch Iceberg's REST server $VERSION; Debian: apt-get install -y maven" >&2
        return 1
    fi
    echo "== fetching Apache Iceberg's REST catalog server $VERSION from Maven Central into $LIB"
    # Into a fresh directory first, renamed when complete: a broken download never looks like a fetched release.
    local partial="$LIB.partial.$$"
    rm -rf "$partial"
    mkdir -p "$(dirname "$LIB")" "$ROOT/var/logs"
    local log="$ROOT/var/logs/iceberg-rest-fetch.log"  # Maven's output, shown only on failure
    if ! mvn -B -ntp -Dstyle.color=never -f "$POM" dependency:copy-dependencies -DincludeScope=runtime \
        -DoutputDirectory="$partial" >"$log" 2>&1; then
        rm -rf "$partial"
        tail -n 40 "$log" >&2
        echo "streamoffload: resolving Iceberg's REST server $VERSION from Maven Central failed (log: $log)" >&2
        return 1
    fi
    rm -rf "$LIB"
    mv "$partial" "$LIB"
    echo "== Iceberg REST server $VERSION: $(find "$LIB" -name '*.jar' | wc -l) jars, $(du -sh "$LIB" | cut -f1)"
}

case "${1:-}" in
    fetch)
        fetch
        ;;
    start)
        [ -n "${2:-}" ] || { sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
        fetch
        DIR="$(mkdir -p "$2/warehouse" && cd "$2" && pwd)"
        # RESTCatalogServer reads its backing catalog's properties from CATALOG_* variables (CATALOG_FOO__BAR_BAZ
        # is foo-bar.baz): a JdbcCatalog on a SQLite file, tables under DIR/warehouse.
        CATALOG_URI="jdbc:sqlite:file:$DIR/catalog.db" CATALOG_WAREHOUSE="file://$DIR/warehouse" \
            CATALOG_REST_PORT="${3:-8181}" exec java -cp "$LIB/*" org.apache.iceberg.rest.RESTCatalogServer
        ;;
    *)
        sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//' >&2
        exit 2
        ;;
esac
