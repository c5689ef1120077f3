#!/usr/bin/env bash
# Set up the virtual environment and run everything CI runs: ruff, then the test suite.
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
            "tests/monitoring/test_prometheus.py will skip (or fail when CI is set)" >&2
    fi
fi
# --- end monitoring ---
echo "== ruff check"
"$VENV/bin/ruff" check .
echo "== pytest"
exec "$PY" -m pytest "$@"
