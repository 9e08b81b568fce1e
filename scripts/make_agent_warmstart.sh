#!/usr/bin/env bash
# The agent warm start (issue 16): LoRA SFT of SmolLM2-135M-Instruct on complete multi-turn
# episodes (agent:sft, from scripts/make_agent_sft.py) mixed with the RLLA SFT rows (settings in
# configs/sft_smollm2_agent.yaml), a bf16 copy of the adapter, and its evals: the RLLA test split
# (single-turn, as for the RLLA warm start) and calculator/search/direct test (100 each, played as
# greedy episodes). INSTALL_ADAPTER=1 copies it into the package with a PROVENANCE.json.
# Another base: BASE=gemma3-270m SHIP_AS=gemma3-270m-agent bash scripts/make_agent_warmstart.sh \
#   outputs/sft_gemma3_agent   (the same data and settings; Gemma's adapter dir keeps its NOTICE)
set -euo pipefail
cd "$(dirname "$0")/.."
base=${BASE:-smollm2-135m}
out=${1:-outputs/sft_smollm2_agent}
toolgrpo sft configs/sft_smollm2_agent.yaml model.path="$base" trainer.output_dir="$out" \
  trainer.logger='[console,jsonl]'
bash scripts/adapter_bf16.sh "$out"
ship="$out/adapter_bf16"
model=(actor_rollout_ref.model.path="$base" actor_rollout_ref.model.adapter_path="$ship")
toolgrpo eval --output "$out/eval_test.json" configs/grpo_smollm2_rlla.yaml "${model[@]}"
# Whole tool results (the gold search results reach 285 tokens), room for two searches.
toolgrpo eval --output "$out/eval_env_test.json" --samples 3 configs/multiturn_smollm2_mixed.yaml \
  "${model[@]}" 'data.val_files=[calculator:test,search:test,direct:test]' \
  data.max_response_length=1024 actor_rollout_ref.rollout.multi_turn.max_tool_response_length=320 \
  actor_rollout_ref.rollout.name=auto  # vLLM when installed: ~6 min for the 300 episodes
if [ "${INSTALL_ADAPTER:-0}" = 1 ]; then
  dest=src/toolgrpo/models/adapters/${SHIP_AS:-smollm2-135m-agent}
  mkdir -p "$dest"
  cp "$ship/adapter_config.json" "$ship/adapter_model.safetensors" "$dest/"
  how="toolgrpo sft configs/sft_smollm2_agent.yaml model.path=$base"
  python scripts/provenance.py "$out" \
    --command "BASE=$base bash scripts/make_agent_warmstart.sh  ($how)" \
    --data "agent:sft (gold calculator/search/direct train episodes, plain + routed) + rlla:sft" \
    > "$dest/PROVENANCE.json"
fi
