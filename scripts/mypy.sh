#!/usr/bin/env bash
# Type-check the package and the benches with mypy ([tool.mypy] in pyproject.toml: strict for codecs, storage,
# checkpoints and read; the default checks elsewhere). The code folders are installed as subpackages of
# `streamoffload` through package-dir, which mypy cannot follow, so it checks a view laid out as installed:
# symbolic links into the tree, kept in .cache/ so mypy's incremental cache stays warm. bench/ is checked as the
# `bench` namespace package the benches import each other as, found in the repository root (mypy's working
# directory, and in MYPYPATH after the view, so that `streamoffload` is the view's). One run checks both: the
# benches import most of the package, and each [tool.mypy] section is used by one side (warn_unused_configs would
# note matplotlib's as unused in a run of the package alone). Errors are shown with the tree's own paths.
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
out=$(MYPYPATH="$VIEW:$ROOT" "$PY" -m mypy --config-file pyproject.toml --cache-dir "$ROOT/.cache/mypy/cache" \
    --python-executable "$PY" -p streamoffload -p bench "$@" 2>&1) || status=$?
# .cache/mypy/view/streamoffload/codecs/x.py -> codecs/x.py; .cache/mypy/view/streamoffload/cli.py -> streamoffload/cli.py;
# bench/x.py stays as it is
sed -E -e 's#^\.cache/mypy/view/streamoffload/(codecs|storage|checkpoints|read|streaming)/#\1/#' \
    -e 's#^\.cache/mypy/view/streamoffload/#streamoffload/#' <<<"$out"
exit "$status"
