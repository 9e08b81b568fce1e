#!/usr/bin/env bash
# GPU smoke check: on a CUDA machine with PyTorch and transformers, a tiny random model (built
# here, no hub) trains 2 GRPO steps with trainer.device=cuda (HF rollout, bf16), then 2 steps
# under FSDP2 with NCCL on one rank, then configs/all_systems.yaml (the four systems) 2 steps under
# FSDP2 on one rank and, where the machine has 2 GPUs, on 2 ranks that each sample their share
# (the default), then `toolgrpo eval` scores the FSDP2 run's checkpoint. One line per check; the
# first failure prints the end of its log and exits 1.
#
#   bash scripts/gpu_smoke.sh [--device cuda|cpu] [--python PY] [--out DIR]
#
# --device cpu is the dry mode CI runs (tests/test_gpu_smoke.py), so the script cannot rot: the
# same checks on the CPU, dtype `auto`, gloo for FSDP2 (2 ranks there too, as 2 processes).
# toolgrpo runs from src/ (PYTHONPATH), not installed: its torch pin need not match the machine's
# torch. The few small dependencies such a machine lacks travel as wheels and go on PYTHONPATH
# beforehand (docs/scale_out.md, "GPU smoke check").
set -euo pipefail
cd "$(dirname "$0")/.."

DEVICE=cuda
PY=python3
OUT=""
while [ $# -gt 0 ]; do
  case "$1" in
    --device) DEVICE=$2; shift 2 ;;
    --python) PY=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "gpu_smoke.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
case "$DEVICE" in cuda|cpu) ;; *) echo "gpu_smoke.sh: --device cuda or cpu" >&2; exit 2 ;; esac
OUT=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/gpu_smoke.XXXXXX")}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
# A rerun into the same --out starts clean: a run directory holding another run is refused.
rm -rf "$OUT/model" "$OUT/train" "$OUT/fsdp2" "$OUT/allsys" "$OUT/allsys2" "$OUT/eval" "$OUT/cache" \
  "$OUT"/*.report.json

export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
# toolgrpo.cli's own defaults, set here because the helper imports torch before it.
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false OMP_WAIT_POLICY=PASSIVE
export TRANSFORMERS_NO_ADVISORY_WARNINGS=1 PYTHONUNBUFFERED=1
export TOOLGRPO_CACHE="$OUT/cache"  # nothing read from or left in ~/.cache/toolgrpo
HELPER=("$PY" scripts/gpu_smoke.py)

if [ "$DEVICE" = cuda ]; then DTYPE=bfloat16; BACKEND=nccl; else DTYPE=auto; BACKEND=gloo; fi
# 2 groups of 4 samples a step, 16 response tokens: seconds a step on the tiny model anywhere.
# A random model's samples mostly score alike, so GRPO's advantages are often all zero; the entropy
# bonus gives every step a gradient, and check-train sees the weights move.
COMMON=(
  "actor_rollout_ref.model.path=$OUT/model" "actor_rollout_ref.model.dtype=$DTYPE"
  actor_rollout_ref.rollout.name=hf "trainer.device=$DEVICE"
  "data.train_files=[rlla:train]" "data.val_files=[rlla:test]" data.max_samples=4
  data.train_batch_size=2 actor_rollout_ref.rollout.n=4 actor_rollout_ref.actor.ppo_mini_batch_size=2
  actor_rollout_ref.actor.entropy_coeff=0.01
  data.max_prompt_length=4096 data.filter_overlong_prompts=false data.max_response_length=16
  data.val_batch_size=8 trainer.total_training_steps=2 trainer.save_freq=-1
  "trainer.logger=[console,jsonl]"
)

now() { date +%s.%N; }
line() { printf '%-5s%s\n' "$1" "$2"; }

# check NAME LABEL CMD...: runs CMD with its output in $OUT/NAME.log and times it; a non-zero exit
# prints FAIL with the log's end and stops the script. `verify` then judges what it left behind.
check() {
  local name=$1 label=$2 t0 rc=0
  shift 2
  t0=$(now)
  "$@" >"$OUT/$name.log" 2>&1 || rc=$?
  ELAPSED=$(awk -v a="$t0" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }')
  if [ "$rc" -ne 0 ]; then
    line FAIL "$label ($ELAPSED s) rc=$rc, log $OUT/$name.log:"
    tail -n 25 "$OUT/$name.log" | sed 's/^/     | /'
    exit 1
  fi
}

# verify NAME LABEL CMD...: CMD prints the one-line summary of a check that ran; ok or FAIL.
verify() {
  local name=$1 label=$2 summary rc=0
  shift 2
  summary=$("$@" 2>>"$OUT/$name.log") || rc=$?
  if [ "$rc" -ne 0 ]; then
    line FAIL "$label ($ELAPSED s) $(tail -n 1 "$OUT/$name.log")"
    exit 1
  fi
  line ok "$label ($ELAPSED s) $summary"
}

check env "env" "${HELPER[@]}" env --device "$DEVICE" --model-dir "$OUT/model" \
  --summary "$OUT/env.txt"
verify env "env" cat "$OUT/env.txt"
# What `auto` resolved to here (bf16 on a GPU or a CPU with native bf16, else float32).
DTYPE_LABEL=$DTYPE
if [ "$DTYPE" = auto ]; then DTYPE_LABEL="$(cat "$OUT/env.dtype") (auto)"; fi

label="train-2-steps $DEVICE $DTYPE_LABEL"
check train "$label" "${HELPER[@]}" cli --report "$OUT/train.report.json" -- \
  train "${COMMON[@]}" "trainer.output_dir=$OUT/train"
verify train "$label" "${HELPER[@]}" check-train "$OUT/train" --report "$OUT/train.report.json" \
  --device "$DEVICE" --steps 2 --init-model "$OUT/model"

# Information, not a check: the last step's rollout/* metrics (the sampler's recorded log-probs
# against the trainer's recomputed ones, where the trainer logs them).
if ! keys=$("${HELPER[@]}" rollout-keys "$OUT/train" 2>>"$OUT/train.log"); then
  line FAIL "rollout-metrics: $(tail -n 1 "$OUT/train.log")"
  exit 1
fi
line info "rollout-metrics $DEVICE $DTYPE_LABEL $keys"

label="fsdp2-2-steps $DEVICE $DTYPE_LABEL $BACKEND 1 rank"
check fsdp2 "$label" "$PY" -m torch.distributed.run --standalone --nproc_per_node 1 \
  scripts/gpu_smoke.py cli --report "$OUT/fsdp2.report.json" -- \
  train "${COMMON[@]}" "trainer.output_dir=$OUT/fsdp2" trainer.distributed.strategy=fsdp2
verify fsdp2 "$label" "${HELPER[@]}" check-train "$OUT/fsdp2" --report "$OUT/fsdp2.report.json" \
  --device "$DEVICE" --steps 2 --init-model "$OUT/model" --backend "$BACKEND"

# configs/all_systems.yaml (router with a budget, a fixed policy on a schedule, multi-turn envs,
# rollback with negatives) under FSDP2 on one rank, the tiny model as actor and fixed policy;
# every step must log each system's metrics.
MT=actor_rollout_ref.rollout.multi_turn
ALLSYS=(
  "actor_rollout_ref.model.path=$OUT/model" "actor_rollout_ref.model.dtype=$DTYPE"
  "rollout_only.model_path=$OUT/model" actor_rollout_ref.rollout.name=hf "trainer.device=$DEVICE"
  actor_rollout_ref.rollout.n=2 data.train_batch_size=2 data.max_samples=8
  data.max_prompt_length=4096 data.max_response_length=48
  actor_rollout_ref.actor.ppo_mini_batch_size=2 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2
  actor_rollout_ref.actor.entropy_coeff=0.01 "$MT.max_tokens_per_turn=12"
  "$MT.max_tool_response_length=16" trainer.total_training_steps=2 trainer.save_freq=-1
  "trainer.logger=[console,jsonl]" trainer.distributed.strategy=fsdp2
)
label="all-systems-2-steps $DEVICE $DTYPE_LABEL $BACKEND 1 rank"
check allsys "$label" "$PY" -m torch.distributed.run --standalone --nproc_per_node 1 \
  scripts/gpu_smoke.py cli --report "$OUT/allsys.report.json" -- \
  train configs/all_systems.yaml "${ALLSYS[@]}" "trainer.output_dir=$OUT/allsys"
verify allsys "$label" "${HELPER[@]}" check-train "$OUT/allsys" --report "$OUT/allsys.report.json" \
  --device "$DEVICE" --steps 2 --init-model "$OUT/model" --backend "$BACKEND" \
  --require router/lambda,rollout/using_fixed,rollout/negative_samples

# The same on 2 ranks, as FSDP2 runs by default: every rank samples its share of each step's
# groups (the fixed policy's among them) and rank 0 collates; both ranks must have sent samples
# at every step. Needs 2 GPUs with --device cuda; on the CPU, 2 gloo processes.
label="fsdp2-2-ranks $DEVICE $DTYPE_LABEL $BACKEND every rank sampling"
DEVICES=$(cat "$OUT/env.devices")
if [ "$DEVICE" = cuda ] && [ "$DEVICES" -lt 2 ]; then
  line skip "fsdp2-2-ranks: $DEVICES CUDA device(s) here, 2 needed"
else
  check allsys2 "$label" "$PY" -m torch.distributed.run --standalone --nproc_per_node 2 \
    scripts/gpu_smoke.py cli --report "$OUT/allsys2.report.json" -- \
    train configs/all_systems.yaml "${ALLSYS[@]}" "trainer.output_dir=$OUT/allsys2"
  verify allsys2 "$label" "${HELPER[@]}" check-train "$OUT/allsys2" \
    --report "$OUT/allsys2.report.json" --device "$DEVICE" --steps 2 --init-model "$OUT/model" \
    --backend "$BACKEND" --require rollout/using_fixed --expect rollout/sampling_ranks=2
fi

label="eval fsdp2 global_step_2 $DEVICE, 8 tasks"
check eval "$label" "${HELPER[@]}" cli --report "$OUT/eval.report.json" -- \
  eval --checkpoint "$OUT/fsdp2/checkpoints/global_step_2" --limit 8 \
  --output "$OUT/eval/eval.json" "${COMMON[@]}" "trainer.output_dir=$OUT/eval"
verify eval "$label" "${HELPER[@]}" check-eval "$OUT/eval/eval.json" \
  --report "$OUT/eval.report.json" --device "$DEVICE" --tasks 8
