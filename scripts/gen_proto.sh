#!/usr/bin/env bash
# Regenerates codecs/proto/*_pb2.py (and .pyi stubs) from the .proto files beside them.
# The generated code is committed; run this after editing a .proto file, and commit both.
#
#   scripts/gen_proto.sh           regenerate in place
#   scripts/gen_proto.sh --check   regenerate into a temporary folder and fail if the committed code differs
#
# Why a pinned generator in its own environment: generated code embeds the protoc version and
# refuses to import under an OLDER protobuf runtime. grpcio-tools 1.76.0 bundles protoc 31.1, which
# emits code for runtime 6.31.1, so it imports under every runtime pyproject.toml allows
# (protobuf>=6.31.1,<8). A newer grpcio-tools (protoc 35.x) would force protobuf>=7.35.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PROTO_DIR="$ROOT/codecs/proto"
GRPCIO_TOOLS_VERSION="1.76.0"
EXPECTED_PROTOC="libprotoc 31.1"
TOOL_VENV="${STREAMOFFLOAD_PROTOC_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/streamoffload/protoc-venv-$GRPCIO_TOOLS_VERSION}"

check=0
case "${1:-}" in
    --check) check=1 ;;
    "") ;;
    *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac

if [ ! -x "$TOOL_VENV/bin/python" ]; then
    echo "== creating generator environment $TOOL_VENV (grpcio-tools==$GRPCIO_TOOLS_VERSION)"
    "${PYTHON:-python3}" -m venv "$TOOL_VENV"
    "$TOOL_VENV/bin/python" -m pip install -q "grpcio-tools==$GRPCIO_TOOLS_VERSION"
fi
version="$("$TOOL_VENV/bin/python" -m grpc_tools.protoc --version)"
if [ "$version" != "$EXPECTED_PROTOC" ]; then
    echo "gen_proto: expected $EXPECTED_PROTOC from grpcio-tools $GRPCIO_TOOLS_VERSION, got '$version'" >&2
    exit 1
fi

# The .proto files are compiled from a staged copy under streamoffload/codecs/proto/ so that the
# file names registered in protobuf's global descriptor pool are "streamoffload/codecs/proto/x.proto":
# unique to us, like the packages, so another library's bookkeeper or pulsar protos never clash.
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
rel="streamoffload/codecs/proto"
mkdir -p "$work/src/$rel" "$work/out"
cd "$PROTO_DIR"
protos=(*.proto)
cp "${protos[@]}" "$work/src/$rel/"
(cd "$work/src" && "$TOOL_VENV/bin/python" -m grpc_tools.protoc -I. --python_out="$work/out" --pyi_out="$work/out" \
    "${protos[@]/#/$rel/}")

status=0
for p in "${protos[@]}"; do
    for f in "${p%.proto}_pb2.py" "${p%.proto}_pb2.pyi"; do
        if [ "$check" = 1 ]; then
            if ! cmp -s "$work/out/$rel/$f" "$PROTO_DIR/$f"; then
                echo "gen_proto: codecs/proto/$f is stale; run scripts/gen_proto.sh" >&2
                status=1
            fi
        else
            cp "$work/out/$rel/$f" "$PROTO_DIR/$f"
        fi
    done
done
[ "$check" = 1 ] && exit "$status"
echo "== generated: ${protos[*]/.proto/_pb2.py}"
