#!/usr/bin/env bash
# The container's build steps, as one script: the Dockerfile runs it, and CI runs it directly (no docker daemon runs
# on CI's machine), so what the image does is what CI checks.
#   1. install headprune with its dashboard and syntax extras (install.sh)
#   2. pre-build the three offline demos into $HEADPRUNE_CACHE (a container's first page then shows in seconds, not
#      the minutes a first build takes; see docs: a classroom on one machine)
#   3. --check: start the dashboard headless on a free port and wait for its health endpoint and its home page
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ "${SKIP_INSTALL:-0}" != 1 ]; then
  bash install.sh
fi
for demo in "" "--lm" "--circuit"; do
  "$PY" -m headprune demo $demo >/dev/null
done
echo "container: demos built in ${HEADPRUNE_CACHE:-the user cache dir}" >&2
if [ "${1:-}" = "--check" ]; then
  PORT=$("$PY" -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
  LOG=$(mktemp)
  # its own process group (setsid): `headprune dashboard` runs streamlit as a child, and both must stop at the end
  setsid "$PY" -m headprune dashboard --port "$PORT" --headless >"$LOG" 2>&1 &
  SERVER=$!
  trap 'kill -- -$SERVER 2>/dev/null || true; rm -f "$LOG"' EXIT
  for _ in $(seq 1 120); do
    if "$PY" - "$PORT" <<'PYEOF' 2>/dev/null; then
import sys, urllib.request
port = sys.argv[1]
assert urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2).read() == b"ok"
assert b"<html" in urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2).read().lower()
PYEOF
      echo "container: dashboard answered on port $PORT" >&2
      exit 0
    fi
    sleep 1
  done
  echo "container: the dashboard did not answer within 120 s; its log:" >&2
  cat "$LOG" >&2
  exit 1
fi
