#!/usr/bin/env bash
# Set up the virtual environment and run everything CI runs: ruff, the import layers, mypy, then the test suite.
# Extra arguments go to pytest (e.g. scripts/test.sh tests/codecs -x).
source "$(dirname "$0")/_env.sh"
check_java
setup_venv test
cd "$ROOT"
# --- monitoring: a real Prometheus for tests/monitoring/test_prometheus.py (Debian package) ---
if ! command -v prometheus >/dev/null 2>&1 && [ ! -x /usr/bin/prometheus ]; then
    if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
        echo "== installing prometheus (apt-get install prometheus)"
        # The tests start their own Prometheus on a free loopback port; a host with systemd also gets
        # the package's service on :9090, which they do not use.
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus
    else
        echo "note: prometheus is not installed and cannot be installed here (needs root and apt-get);" \
            "the prometheus and promtool tests in tests/monitoring will skip (or fail when CI is set)" >&2
    fi
fi
# --- end monitoring ---
# --- PostgreSQL: the production Iceberg catalog of tests/table/test_catalogs.py (Debian package; the tests run
#     their own cluster with initdb + pg_ctl on a free loopback port, tests/fixtures/postgres.py) ---
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
        echo "== installing postgresql (apt-get install postgresql)"
        # A host with systemd also gets the package's own cluster on :5432, which the tests do not use.
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql
    else
        echo "note: postgresql is not installed and cannot be installed here (needs root and apt-get);" \
            "the PostgreSQL catalog tests in tests/table will skip (or fail when CI is set)" >&2
    fi
fi
# --- end PostgreSQL ---
# --- s3rver: a second S3 implementation for tests/storage (npm, into .cache/s3rver; see tests/fixtures/s3rver.py) ---
S3RVER_VERSION=3.7.1
S3RVER_DIR="${STREAMOFFLOAD_S3RVER_DIR:-$ROOT/.cache/s3rver}"
if ! grep -qs "\"version\": \"$S3RVER_VERSION\"" "$S3RVER_DIR/node_modules/s3rver/package.json"; then
    if command -v npm >/dev/null 2>&1 && command -v node >/dev/null 2>&1; then
        echo "== installing s3rver $S3RVER_VERSION into $S3RVER_DIR"
        mkdir -p "$S3RVER_DIR"
        npm install --prefix "$S3RVER_DIR" --no-audit --no-fund --no-save --loglevel=error \
            "s3rver@$S3RVER_VERSION" >/dev/null
    else
        echo "note: node/npm are not installed; the s3rver tests in tests/storage will skip (or fail when CI is set)" >&2
    fi
fi
# --- end s3rver ---
# --- Maven: the Pulsar reader harness and the Apache Pulsar broker below resolve from Maven Central ---
if ! command -v mvn >/dev/null 2>&1 && [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "== installing maven (apt-get install maven)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends maven
fi
# --- end Maven ---
# --- pulsar-reader: Pulsar's own offloader as a reader of our objects, for tests/interop (Maven, into
#     .cache/pulsar_reader; see tests/fixtures/pulsar_reader.py). Rebuilt when its sources are newer. ---
PULSAR_READER_SRC="$ROOT/tests/pulsar_reader"
PULSAR_READER_DIR="$ROOT/.cache/pulsar_reader"
PULSAR_READER_CLASS="$PULSAR_READER_DIR/target/classes/streamoffload/pulsarreader/ReadOffloaded.class"
if [ ! -f "$PULSAR_READER_CLASS" ] || [ -n "$(find "$PULSAR_READER_SRC" -newer "$PULSAR_READER_CLASS" -type f)" ]; then
    if command -v mvn >/dev/null 2>&1; then
        echo "== building the Pulsar reader harness into $PULSAR_READER_DIR (Maven; a cold ~/.m2 takes minutes)"
        mkdir -p "$PULSAR_READER_DIR"
        if ! mvn -q -B -s "$PULSAR_READER_SRC/settings.xml" -f "$PULSAR_READER_SRC/pom.xml" package \
            >"$PULSAR_READER_DIR/build.log" 2>&1; then
            tail -n 40 "$PULSAR_READER_DIR/build.log" >&2
            echo "streamoffload: building tests/pulsar_reader failed (log: $PULSAR_READER_DIR/build.log)" >&2
            exit 1
        fi
        touch "$PULSAR_READER_CLASS"  # Maven may leave an up-to-date class as it was: mark it newer than its sources
    else
        echo "note: mvn is not installed; the Pulsar reader tests in tests/interop will skip" \
            "(or fail when CI is set)" >&2
    fi
fi
# --- end pulsar-reader ---
# --- Apache Pulsar: the real broker of the `pulsar` tests (Maven Central, into .cache/pulsar; scripts/pulsar.sh) ---
if command -v mvn >/dev/null 2>&1; then
    bash "$ROOT/scripts/pulsar.sh" fetch \
        || echo "note: fetching Apache Pulsar failed; the pulsar tests will skip (or fail when CI is set)" >&2
else
    echo "note: Maven is not installed; the Apache Pulsar tests (marker pulsar) will skip (or fail when CI is set)" >&2
fi
# --- end Apache Pulsar ---
# --- Iceberg REST server: the REST catalog of tests/table/test_catalogs.py (Maven Central, into .cache/iceberg_rest;
#     scripts/iceberg_rest.sh) ---
if command -v mvn >/dev/null 2>&1; then
    bash "$ROOT/scripts/iceberg_rest.sh" fetch \
        || echo "note: fetching Iceberg's REST server failed; the REST catalog tests will skip (or fail when CI is set)" >&2
else
    echo "note: Maven is not installed; the REST catalog tests in tests/table will skip (or fail when CI is set)" >&2
fi
# --- end Iceberg REST server ---
echo "== ruff check, ruff format --check"
"$VENV/bin/ruff" check .
"$VENV/bin/ruff" format --check .
echo "== import layers (docs/DESIGN.md)"
PY="$PY" bash "$ROOT/scripts/check_layers.sh"
echo "== mypy, the package and bench/ (pyproject.toml [tool.mypy]: strict for codecs, storage, checkpoints, read)"
PY="$PY" bash "$ROOT/scripts/mypy.sh"
echo "== pytest"
# Two pytest-xdist workers by default, each taking whole files (a file's module fixtures start once): the suite's
# heavy files (chaos, soak, scale, the fetch faults) then run two at once, and their checks hold with another file
# beside them. STREAMOFFLOAD_TEST_WORKERS=0 runs it in one process.
exec "$PY" -m pytest --durations=25 -n "${STREAMOFFLOAD_TEST_WORKERS:-2}" --dist loadfile "$@"
