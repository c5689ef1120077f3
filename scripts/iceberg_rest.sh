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
source "$ROOT/scripts/_maven_fetch.sh"
POM="$ROOT/scripts/iceberg_rest/pom.xml"
VERSION="$(sed -n 's|.*<iceberg.version>\(.*\)</iceberg.version>.*|\1|p' "$POM")"
LIB="${STREAMOFFLOAD_ICEBERG_REST_LIB:-$ROOT/.cache/iceberg_rest/$VERSION/lib}"

fetch() {
    maven_fetch "the Iceberg REST server $VERSION" "$POM" "$LIB" "iceberg-open-api-$VERSION-test-fixtures.jar" iceberg-rest-fetch.log
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
