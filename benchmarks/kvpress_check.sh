#!/usr/bin/env bash
# kvpress reproduces a headprune plan's head set (issue 37). kvpress 0.5.5 pins transformers < 5.3, which headprune's
# pin excludes, so kvpress runs in its own virtualenv with its own pins; the plan file is the only thing that
# crosses. Steps: headprune writes a plan for demo-lm (6 blocks x 2 key/value groups, far-mass scores), then the
# separate environment runs benchmarks/kvpress_check.py (HeadprunePlanPress on a random Llama of the plan's grid).
# Usage: benchmarks/kvpress_check.sh [VENV_DIR]   (default: $TMPDIR/headprune-kvpress-venv; reused when present)
# KVPRESS_MODEL / KVPRESS_DATA: another decoder and its rows for the plan (default: demo-lm, demo-lm)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="${1:-${TMPDIR:-/tmp}/headprune-kvpress-venv}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
start=$(date +%s)
python -m headprune kvplan --model "${KVPRESS_MODEL:-demo-lm}" --data "${KVPRESS_DATA:-demo-lm}" --rule far-mass --calib-size 16 --full-share 0.25 \
    --sink 4 --window 16 --out "$work/plan.json" > /dev/null
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
    # torch first (TORCH_SPEC; point pip at a CPU wheel with PIP_FIND_LINKS or PIP_INDEX_URL to skip the CUDA
    # download), then kvpress with its own pins (transformers < 5.3)
    "$venv/bin/pip" install -q "${TORCH_SPEC:-torch==2.13.0}"
    "$venv/bin/pip" install -q "kvpress==0.5.5"
fi
installed=$(date +%s)
(cd "$here" && env -u PYTHONPATH "$venv/bin/python" kvpress_check.py "$work/plan.json")
echo "kvpress check: $((installed - start)) s plan + environment, $(( $(date +%s) - installed )) s check" >&2
