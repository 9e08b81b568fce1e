#!/usr/bin/env bash
# Sets everything up, then runs the whole test suite: the core tier (tiny models, plus a few tests
# on SmolLM2), then the vLLM-CPU and Ray tiers, each in its own pytest process (one shared engine,
# one local cluster), then the browser tier (the HTML report in Debian's headless chromium, installed
# here with apt when missing). With arguments, one pytest run of just those (e.g. a test path).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export OMP_WAIT_POLICY=PASSIVE HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export TOOLGRPO_REQUIRE_BACKENDS=1  # a tier whose backend does not import fails instead of skipping
PYTEST=(.venv/bin/python -m pytest -q -p no:cacheprovider)
if [ $# -gt 0 ]; then exec "${PYTEST[@]}" "$@"; fi
# One model cache for the tiers below, empty at the start and removed at the end: each tier's
# pytest process would otherwise convert SmolLM2's GGUF again (~45 s on 2 AVX2 cores).
TOOLGRPO_TEST_CACHE=$(mktemp -d "${TMPDIR:-/tmp}/toolgrpo_test_cache.XXXXXX")
export TOOLGRPO_TEST_CACHE
trap 'rm -rf "$TOOLGRPO_TEST_CACHE"' EXIT
"${PYTEST[@]}" --ignore=tests/vllm --ignore=tests/ray -m "not browser"
"${PYTEST[@]}" tests/vllm
"${PYTEST[@]}" tests/ray
if ! command -v chromium >/dev/null; then
  SUDO=$([ "$(id -u)" = 0 ] || echo sudo)
  $SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q chromium chromium-driver
fi
TOOLGRPO_REQUIRE_BROWSER=1 "${PYTEST[@]}" -m browser tests/report
