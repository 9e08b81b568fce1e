#!/usr/bin/env bash
# The shipped form of an SFT run's LoRA adapter: RUN_DIR/adapter copied to RUN_DIR/adapter_bf16 with
# its weights in bf16 (half the size; trainable copies are made fp32 again when loaded).
set -euo pipefail
out=$1
ship="$out/adapter_bf16"
mkdir -p "$ship"
cp "$out/adapter/adapter_config.json" "$ship/"
python -c "import sys, torch; from safetensors.torch import load_file, save_file; \
sd = load_file(sys.argv[1]); save_file({k: v.to(torch.bfloat16) for k, v in sd.items()}, sys.argv[2])" \
  "$out/adapter/adapter_model.safetensors" "$ship/adapter_model.safetensors"
