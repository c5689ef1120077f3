#!/usr/bin/env bash
# Type-check the package with mypy ([tool.mypy] in pyproject.toml: strict for codecs, storage, checkpoints and
# read; the default checks elsewhere). The code folders are installed as subpackages of `streamoffload` through
# package-dir, which mypy cannot follow, so it checks a view laid out as installed: symbolic links into the
# tree, kept in .cache/ so mypy's incremental cache stays warm. Errors are shown with the tree's own paths.
# Extra arguments go to mypy.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PY:-$ROOT/.venv/bin/python}"
[[ "$PY" = /* ]] || PY="$PWD/$PY"
VIEW="$ROOT/.cache/mypy/view"
rm -rf "$VIEW"
mkdir -p "$VIEW/streamoffload"
for entry in "$ROOT"/streamoffload/*; do
    ln -s "$entry" "$VIEW/streamoffload/"
done
for pkg in codecs storage checkpoints read streaming; do
    ln -s "$ROOT/$pkg" "$VIEW/streamoffload/$pkg"
done
cd "$ROOT"
status=0
out=$(MYPYPATH="$VIEW" "$PY" -m mypy --config-file pyproject.toml --cache-dir "$ROOT/.cache/mypy/cache" \
    --python-executable "$PY" -p streamoffload "$@" 2>&1) || status=$?
# .cache/mypy/view/streamoffload/codecs/x.py -> codecs/x.py; .cache/mypy/view/streamoffload/cli.py -> streamoffload/cli.py
sed -E -e 's#^\.cache/mypy/view/streamoffload/(codecs|storage|checkpoints|read|streaming)/#\1/#' \
    -e 's#^\.cache/mypy/view/streamoffload/#streamoffload/#' <<<"$out"
exit "$status"
