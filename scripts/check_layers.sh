#!/usr/bin/env bash
# Check the import layers declared in pyproject.toml ([tool.importlinter]) with import-linter, then report
# the uses of typing.Any per layer and hold each to its ceiling (scripts/any_count.py, scripts/any_ceiling.txt),
# and fail on any import cycle, those under TYPE_CHECKING included (scripts/import_cycles.py).
# The code folders are installed as subpackages of `streamoffload` through package-dir, which
# import-linter's module finder cannot follow, so the check runs on a copy laid out as installed.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PY:-$ROOT/.venv/bin/python}"
[[ "$PY" = /* ]] || PY="$PWD/$PY"
VIEW="$(mktemp -d)"
trap 'rm -rf "$VIEW"' EXIT
cp -r "$ROOT/streamoffload" "$VIEW/streamoffload"
for pkg in codecs storage checkpoints read streaming; do
    cp -r "$ROOT/$pkg" "$VIEW/streamoffload/$pkg"
done
cp "$ROOT/pyproject.toml" "$VIEW/"
cd "$VIEW"
# PYTHONPATH puts the copy ahead of the editable install's finder, so `streamoffload` is the copy.
status=0
out=$(PYTHONPATH="$VIEW" "$PY" -c 'import sys
from importlinter.cli import lint_imports_command
sys.argv = ["lint-imports", "--no-cache", "--config", "pyproject.toml"]
lint_imports_command()' 2>&1) || status=$?
# import-linter prints a banner first: show its verdict, and on failure what broke.
if [ "$status" -eq 0 ]; then
    grep -E "^Contracts:" <<<"$out" || echo "$out"
else
    sed -n '/Contracts:/,$p' <<<"$out" | grep -v '^\s*$'
    [ -n "$(sed -n '/Contracts:/,$p' <<<"$out")" ] || echo "$out"
fi
"$PY" "$ROOT/scripts/any_count.py" || status=1
"$PY" "$ROOT/scripts/import_cycles.py" || status=1
exit "$status"
