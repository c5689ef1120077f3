#!/usr/bin/env bash
# Set up the virtual environment and run the main job on the embedded default
# (local Spark, pulsar-lite broker, filesystem store), showing it working.
# The terminal shows the story (what starts, one line per micro-batch, the status table, the read-back
# check); every log line goes to var/demo/logs/demo.log, which the demo names. Options go to
# `streamoffload demo` (see --help), e.g. `bash scripts/demo.sh --messages 500`.
source "$(dirname "$0")/_env.sh"
check_java
setup_venv demo
cd "$ROOT"
exec "$VENV/bin/streamoffload" demo "$@"
