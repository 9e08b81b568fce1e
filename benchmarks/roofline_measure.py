"""What benchmarks/roofline.py measures on the hardware: this machine's roofs (the best GEMM
throughput on the model's own shapes, fp32 and bf16, per thread count; the memory bandwidth) and
the generator's decode rate at the main job's batch; and the config, machine record and
main-job-shaped update inputs that roofline.py and profile_update.py share."""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path
from typing import Any

import torch
from roofline_lib import (
    ModelShape,
    cpu_flags,
    gemm_flops,
    group_lengths,
    parse_groups,
    response_mask,
)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
SLOW_S = 2.0
LORA_TARGETS = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
# Response lengths (whole episodes after the prompt, tool results included) of 8 groups x 4: mean
# 121, longest 440, one long episode beside short ones as in the main job (its medians over
# steps: prompt 358, response mean 111, longest 437; results/agent_main_job_metrics.jsonl).
RESPONSES = ";".join(
    [
        "440,60,80,100",
        "200,150,120,90",
        "110,100,90,80",
        "300,70,60,50",
        "140,130,120,110",
        "90,80,70,60",
        "250,200,60,40",
        "120,110,100,90",
    ]
)
# The main job's median share of tool output after the prompt: 1 − response_length/sampled_mean
# over response_length/mean in results/agent_main_job_metrics.jsonl (main_job_reference).
TOOL_SHARE = 0.68
TINY = [  # the tiny random model with a LoRA shaped like the shipped adapter's
    "actor_rollout_ref.model.lora_rank=16",
    "actor_rollout_ref.model.lora_alpha=32",
    f"actor_rollout_ref.model.target_modules={LORA_TARGETS}",
]


def gemm_shapes(s: ModelShape, tiny: bool) -> list[tuple[int, int, int]]:
    """``(m, k, n)``: a batch of tokens through the model's projections, an LM-head chunk (4
    rows × 64 positions, toolgrpo's chunk) and, full size, a square reference."""
    m = 256 if tiny else 2048
    shapes = [(m, s.hidden, s.intermediate), (m, s.intermediate, s.hidden), (m, s.hidden, s.hidden)]
    shapes.append((256, s.hidden, s.vocab))
    if not tiny:
        shapes.append((1024, 1024, 1024))
    return shapes


def gemm_peak(
    dtype: torch.dtype, threads: int, shapes: list[tuple[int, int, int]], repeats: int
) -> dict[str, Any]:
    """Best GFLOP/s of ``a @ b`` per shape (one warm-up each, into a kept output) over
    ``repeats`` runs, or 2 once they take ``SLOW_S`` (emulated bf16 runs ~20x slower than fp32)."""
    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    per_shape = []
    for m, k, n in shapes:
        a = torch.randn(m, k, generator=g).to(dtype)
        b = torch.randn(k, n, generator=g).to(dtype)
        out = torch.empty(m, n, dtype=dtype)
        torch.matmul(a, b, out=out)
        times: list[float] = []
        while len(times) < repeats and (len(times) < 2 or sum(times) < SLOW_S):
            t0 = time.perf_counter()
            torch.matmul(a, b, out=out)
            times.append(time.perf_counter() - t0)
        best = min(times)
        per_shape.append({"shape": [m, k, n], "gflops": gemm_flops(m, k, n) / best / 1e9})
    top = max(per_shape, key=lambda r: r["gflops"])
    return {"gflops": top["gflops"], "best_shape": top["shape"], "shapes": per_shape}


def bandwidth(threads: int, mb: int, repeats: int) -> dict[str, Any]:
    """Best-of-``repeats`` GB/s of a copy (bytes read + written) and a sum (bytes read)."""
    torch.set_num_threads(threads)
    n = mb * 2**20 // 4
    src = torch.ones(n)  # pages touched before timing
    dst = torch.zeros(n)
    copy = read = float("inf")
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        dst.copy_(src)
        t1 = time.perf_counter()
        src.sum()
        t2 = time.perf_counter()
        copy, read = min(copy, t1 - t0), min(read, t2 - t1)
    size = n * 4
    copy_gbs, read_gbs = 2 * size / copy / 1e9, size / read / 1e9
    return {"mb": mb, "copy_gbs": copy_gbs, "read_gbs": read_gbs, "gbs": max(copy_gbs, read_gbs)}


def measure_peaks(s: ModelShape, a: argparse.Namespace, threads: list[int]) -> dict[str, Any]:
    shapes = gemm_shapes(s, a.tiny)
    gemm = {
        name: {str(t): gemm_peak(dt, t, shapes, a.repeats) for t in threads}
        for name, dt in DTYPES.items()
    }
    bw = {str(t): bandwidth(t, a.bandwidth_mb, a.repeats) for t in threads}
    return {"gemm": gemm, "bandwidth": bw}


def _timed_generate(gen: Any, backend: str, prompts: list[list[int]], n: int, new: int, seed: int):
    """Seconds and tokens of one generate call with every row decoding exactly ``new`` tokens."""
    if backend == "vllm":
        from vllm import SamplingParams as VLLMParams
        from vllm.inputs import TokensPrompt

        reqs = [TokensPrompt(prompt_token_ids=list(p)) for p in prompts]
        # The product's request (vllm_backend.sampling_request) without its stop tokens.
        params = [
            VLLMParams(
                n=n,
                temperature=1.0,
                max_tokens=new,
                ignore_eos=True,
                logprobs=0,
                seed=seed + i,
                detokenize=False,
            )
            for i in range(len(prompts))
        ]
        t0 = time.perf_counter()
        outs = gen._engine.run(gen.llm.generate, reqs, params, use_tqdm=False)
        dt = time.perf_counter() - t0
        return dt, sum(len(o.token_ids) for r in outs for o in r.outputs)
    from toolgrpo.rollout.generator import SamplingParams

    t0 = time.perf_counter()
    done = gen.generate(prompts, SamplingParams(n=n, max_new_tokens=new))
    return time.perf_counter() - t0, sum(len(c.token_ids) for c in done)


def measure_generation(cfg: Any, policy: Any, a: argparse.Namespace) -> dict[str, Any]:
    """Decode tok/s of the config's backend at ``train_batch_size × n`` rows (prefill removed)."""
    from toolgrpo.rollout.backends import backend_name, make_generator

    r = cfg.actor_rollout_ref.rollout
    prompts_n, n = cfg.data.train_batch_size, r.n
    vocab = min(policy.base.config.vocab_size, 10_000)
    g = torch.Generator().manual_seed(1)
    prompts = [
        torch.randint(10, vocab, (a.prompt,), generator=g).tolist() for _ in range(prompts_n)
    ]
    backend = backend_name(cfg, policy.base.config)
    t0 = time.perf_counter()
    gen = make_generator(cfg, policy)
    start_s = time.perf_counter() - t0
    if backend == "hf":  # no stop token (an id past the vocabulary): every row decodes them all
        gen.eos_ids = [policy.base.config.vocab_size]
    try:
        _timed_generate(gen, backend, prompts, n, a.new_tokens, 0)  # warm-up
        full, one = [], []
        for i in range(a.gen_repeats):
            one.append(_timed_generate(gen, backend, prompts, n, 1, 100 + i))
            full.append(_timed_generate(gen, backend, prompts, n, a.new_tokens, 200 + i))
    finally:
        close = getattr(gen, "close", None)
        if close is not None:
            close()
    decode_s = min(t for t, _ in full) - min(t for t, _ in one)
    decode_tokens = full[0][1] - one[0][1]
    dtype = policy.dtype
    if backend == "vllm":
        from toolgrpo.rollout.vllm_backend import engine_dtype

        dtype = DTYPES[engine_dtype(r.dtype, torch.cuda.is_available())]
    return {
        "backend": backend,
        "dtype": str(dtype).removeprefix("torch."),
        "threads": torch.get_num_threads(),
        "batch": prompts_n * n,
        "prompts": prompts_n,
        "n": n,
        "prompt_tokens": a.prompt,
        "new_tokens": a.new_tokens,
        "engine_start_s": start_s,
        "runs_s": {"one_token": [t for t, _ in one], "all_tokens": [t for t, _ in full]},
        "tokens": {"one_token": one[0][1], "all_tokens": full[0][1]},
        "decode_s": decode_s,
        "decode_tokens": decode_tokens,
        "decode_tok_s": decode_tokens / decode_s,
    }


# ---- the config, the machine and the update's inputs ---------------------------------------------
def load_cfg(a: argparse.Namespace, work: Path) -> tuple[Any, list[str]]:
    """The config with ``--tiny``'s model and LoRA (before the user's overrides)."""
    from toolgrpo.config.loader import load_config
    from toolgrpo.config.schema import TrainConfig

    overrides = list(a.overrides)
    if a.tiny:
        from toolgrpo.models.tiny import build_tiny_model_dir

        tiny = build_tiny_model_dir(work / "tiny", hidden_size=a.tiny_hidden)
        overrides = [f"actor_rollout_ref.model.path={tiny}", *TINY, *overrides]
    return load_config(TrainConfig, a.config, overrides), overrides


def machine(threads: int) -> dict[str, Any]:
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        info = ""
    name = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if "model name" in ln), "")
    return {
        "cpu": name or platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "cpu_flags": cpu_flags(info),
        "torch": torch.__version__,
        "threads": threads,
        "load_avg_start": list(os.getloadavg()),
    }


def synthetic_batch(
    vocab: int, prompt: int, groups: list[list[int]], pad_id: int, tool_share: float = 0.0
) -> Any:
    """GRPO groups of random tokens: one prompt per group, responses of the given lengths with
    ``tool_share`` of each row tool output (mask 0) between the model's call and its answer,
    non-zero advantages so every row has a gradient."""
    from toolgrpo.trainer.batch import collate_rows

    g = torch.Generator().manual_seed(0)
    rows, uids = [], []
    for gi, lengths in enumerate(groups):
        p = torch.randint(10, vocab, (prompt,), generator=g).tolist()
        for r in lengths:
            ids = torch.randint(10, vocab, (r,), generator=g).tolist()
            lps = (-0.5 - torch.rand(r, generator=g)).tolist()
            rows.append((p, ids, response_mask(r, tool_share), lps))
            uids.append(f"g{gi}")
    b = collate_rows(rows, uids, pad_id)
    b.old_logprobs_BR = b.rollout_logprobs_BR.clone()
    # The main job's KL anchor reads reference log-probs in the loss; their values do not change
    # the update's cost (the reference's own forward is a separate pass, not measured here).
    b.ref_logprobs_BR = b.rollout_logprobs_BR.clone()
    b.advantages_BR = torch.randn(b.size, 1, generator=g) * b.response_mask_BR
    return b


def update_groups(cfg: Any, responses: str, tiny: bool) -> list[list[int]]:
    """``train_batch_size`` groups of ``rollout.n`` response lengths cycling through
    ``responses`` (scaled to a tenth for the tiny model)."""
    n = cfg.actor_rollout_ref.rollout.n
    return group_lengths(
        parse_groups(responses), cfg.data.train_batch_size, n, 0.1 if tiny else 1.0
    )


def update_inputs(
    cfg: Any, policy: Any, prompt: int, groups: list[list[int]], tool_share: float, steps: int
) -> tuple[Any, Any]:
    """The trainer's ``Actor`` (scheduled for ``steps`` updates) and a synthetic batch of
    ``groups`` over a ``prompt``-token prompt, token ids below 10,000."""
    from toolgrpo.trainer.actor import Actor

    actor = Actor(policy, cfg, total_steps=steps)
    vocab = min(policy.base.config.vocab_size, 10_000)
    pad = policy.tokenizer.pad_token_id
    return actor, synthetic_batch(vocab, prompt, groups, pad, tool_share)
