#!/usr/bin/env bash
# Reproduces the shipped warm-start adapter (src/toolgrpo/models/adapters/smollm2-135m-toolrl):
# LoRA SFT of SmolLM2-135M-Instruct on the embedded RLLA SFT rows, then eval on the test split.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-outputs/sft_smollm2_toolrl}
toolgrpo sft configs/sft_smollm2_toolrl.yaml trainer.output_dir="$out" trainer.logger='[console,jsonl]'
toolgrpo eval --output "$out/eval_test.json" configs/grpo_smollm2_rlla.yaml \
  actor_rollout_ref.model.path=smollm2-135m actor_rollout_ref.model.adapter_path="$out/adapter"
if [ "${INSTALL_ADAPTER:-0}" = 1 ]; then
  dest=src/toolgrpo/models/adapters/smollm2-135m-toolrl
  mkdir -p "$dest"
  cp "$out/adapter/adapter_config.json" "$out/adapter/adapter_model.safetensors" "$dest/"
  python scripts/provenance.py "$out" > "$dest/PROVENANCE.json"
fi
