#!/usr/bin/env bash
# Set up the virtual environment and run everything CI runs: ruff, then the test suite.
# Extra arguments go to pytest (e.g. scripts/test.sh tests/codecs -x).
source "$(dirname "$0")/_env.sh"
check_java
setup_venv test
cd "$ROOT"
echo "== ruff check"
"$VENV/bin/ruff" check .
echo "== pytest"
exec "$PY" -m pytest "$@"
