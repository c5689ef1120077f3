#!/usr/bin/env bash
# Set up the virtual environment and run the main job on the embedded default
# (local Spark, pulsar-lite broker, filesystem store), showing it working.
source "$(dirname "$0")/_env.sh"
check_java
setup_venv test
cd "$ROOT"
exec "$VENV/bin/streamoffload" demo "$@"
