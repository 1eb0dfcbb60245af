#!/usr/bin/env bash
# llama.cpp runs `prune --format gguf` files as headprune's cut model (issue 48). llama-cpp-python has no wheel on
# PyPI: it compiles llama.cpp from its sdist, so it lives in its own virtualenv (no torch there) and the GGUF files
# plus headprune's reference logits and token ids are the only things that cross. Steps: headprune writes the cases
# (benchmarks/gguf_check_write.py: demo-lm cut and dense, random uneven-masked Llama / Mistral / Qwen2 / Phi-3,
# RoPE scalings, every mapped pre-tokenizer), then the separate environment runs benchmarks/gguf_check.py
# (llama.cpp's f32 logits within 1e-3 of their scale, its tokenizer's ids equal to headprune's).
# Setup, measured 2026-11-28 on the 2-core shared box (load average 9-18 from other users, nice 19, one compile
# job, the CMAKE_ARGS below): building llama-cpp-python 0.3.36 took 5,439 s (91 min) wall; then writing the cases
# took 80 s and llama.cpp's check 160 s (nice 10). Too long for CI's 90 minutes: a benchmark script, run by hand.
# Usage: benchmarks/gguf_check.sh [VENV_DIR]   (default: $TMPDIR/headprune-llama-venv; reused when present)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="${1:-${TMPDIR:-/tmp}/headprune-llama-venv}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
start=$(date +%s)
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import llama_cpp" 2>/dev/null; then
    python3 -m venv "$venv"
    # one compile job at the lowest priority: the box is shared; portable x86-64 with AVX2 / FMA / F16C kernels,
    # and none of llama.cpp's tools, tests, server or multimodal library (only the library the binding loads)
    nice -n 19 env CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-1}" \
        CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF -DGGML_OPENMP=OFF}" \
        "$venv/bin/pip" install -q --no-cache-dir "llama-cpp-python==0.3.36" "numpy"
fi
installed=$(date +%s)
python3 "$here/gguf_check_write.py" "$work" 2> "$work/notes.txt"
written=$(date +%s)
(cd "$here" && env -u PYTHONPATH "$venv/bin/python" gguf_check.py "$work")
echo "gguf check: $((installed - start)) s environment, $((written - installed)) s writing, $(( $(date +%s) - written )) s llama.cpp" >&2
