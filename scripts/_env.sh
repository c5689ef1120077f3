# Shared by the scripts here: a project virtual environment with the package installed, and a
# Java 17+ check (Spark needs it). Source it; it sets $PY to the environment's python.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${STREAMOFFLOAD_VENV:-$ROOT/.venv}"

check_java() {
    if ! command -v java >/dev/null 2>&1; then
        echo "streamoffload: Java 17 or newer is required by Spark, and no 'java' is on PATH." >&2
        echo "  Debian/Ubuntu: apt-get install -y openjdk-17-jre-headless" >&2
        exit 1
    fi
    local major
    major=$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n1)
    if [ -z "$major" ] || [ "$major" -lt 17 ]; then
        echo "streamoffload: Java 17 or newer is required by Spark; found: $(java -version 2>&1 | head -n1)" >&2
        exit 1
    fi
}

setup_venv() {
    local extras="$1"
    local py="${PYTHON:-python3}"
    if ! "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
        echo "streamoffload: Python 3.11 or newer is required; $py is $("$py" --version 2>&1)" >&2
        exit 1
    fi
    if [ ! -x "$VENV/bin/python" ]; then
        echo "== creating virtual environment $VENV"
        "$py" -m venv "$VENV"
    fi
    # Reinstall only when the project's dependency list changed since the last install.
    local stamp="$VENV/.streamoffload-installed-$extras"
    if [ ! -f "$stamp" ] || [ "$ROOT/pyproject.toml" -nt "$stamp" ]; then
        echo "== installing streamoffload[$extras] into $VENV"
        # pip's output (pages of build warnings on a new machine) goes to a log, shown only on failure.
        mkdir -p "$ROOT/var/logs"
        local install_log="$ROOT/var/logs/install.log"
        if ! { "$VENV/bin/python" -m pip install -q --upgrade pip \
            && "$VENV/bin/python" -m pip install -q -e "$ROOT[$extras]"; } >"$install_log" 2>&1; then
            cat "$install_log" >&2
            echo "streamoffload: installing streamoffload[$extras] failed (log: $install_log)" >&2
            exit 1
        fi
        touch "$stamp"
    fi
    PY="$VENV/bin/python"
    export PYSPARK_PYTHON="$PY" PYSPARK_DRIVER_PYTHON="$PY"
}
