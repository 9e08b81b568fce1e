#!/usr/bin/env bash
# Reproduces the shipped warm-start adapter (src/toolgrpo/models/adapters/smollm2-135m-toolrl):
# LoRA SFT of SmolLM2-135M-Instruct on the embedded RLLA SFT rows (seed, data and settings in
# configs/sft_smollm2_toolrl.yaml), a bf16 copy of the adapter (what ships), and its eval on the
# RLLA test split. INSTALL_ADAPTER=1 copies it into the package with a PROVENANCE.json.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-outputs/sft_smollm2_toolrl}
toolgrpo sft configs/sft_smollm2_toolrl.yaml trainer.output_dir="$out" trainer.logger='[console,jsonl]'
bash scripts/adapter_bf16.sh "$out"
ship="$out/adapter_bf16"
toolgrpo eval --output "$out/eval_test.json" configs/grpo_smollm2_rlla.yaml \
  actor_rollout_ref.model.path=smollm2-135m actor_rollout_ref.model.adapter_path="$ship"
if [ "${INSTALL_ADAPTER:-0}" = 1 ]; then
  dest=src/toolgrpo/models/adapters/smollm2-135m-toolrl
  mkdir -p "$dest"
  cp "$ship/adapter_config.json" "$ship/adapter_model.safetensors" "$dest/"
  python scripts/provenance.py "$out" > "$dest/PROVENANCE.json"
fi
