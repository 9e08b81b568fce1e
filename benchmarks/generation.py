"""Rollout generation, HF vs vLLM: tokens/s on the same RLLA prompts and sampling settings, then
the GRPO step time of the same training config with each backend.

Run by hand (minutes on a 2-core CPU; needs the vLLM venv, see README):
    python benchmarks/generation.py [--prompts 16] [--tokens 128] [--repeats 3] [--steps 3]
        [--threads N] [--skip-train] [key=value ...]   # overrides for both parts' config
Smoke test: --prompts 2 --tokens 8 --repeats 1 --steps 1
Writes benchmarks/results/generation.json and prints one table. Compare backends measured in the
same run only: another process on the same cores changes absolute numbers several-fold.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from toolgrpo.config.loader import load_config  # noqa: E402
from toolgrpo.config.schema import TrainConfig  # noqa: E402
from toolgrpo.data.loader import load_tasks  # noqa: E402
from toolgrpo.models.loading import load_policy  # noqa: E402
from toolgrpo.rollout.generator import Completion, SamplingParams  # noqa: E402
from toolgrpo.rollout.hf import HFGenerator  # noqa: E402
from toolgrpo.rollout.prompts import render_prompt  # noqa: E402

CONFIG = Path(__file__).parent.parent / "configs" / "grpo_smollm2_rlla.yaml"
FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16")
STEP_KEYS = (
    "timing/gen_s",
    "timing/logprob_s",
    "timing/train_s",
    "timing/weight_sync_s",
    "timing/step_s",
    "tokens/generated",
)


def machine(threads: int) -> dict[str, Any]:
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        info = ""
    words = set(info.split())
    name = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if "model name" in ln), "")
    return {
        "cpu": name or platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "flags": sorted(f for f in FLAGS if f in words),
        "torch_threads": threads,
        "load_avg_start": os.getloadavg(),
        "torch": torch.__version__,
    }


def train_config(backend: str, steps: int, out: str, overrides: list[str]) -> TrainConfig:
    fixed = [
        f"actor_rollout_ref.rollout.name={backend}",
        f"trainer.total_training_steps={steps}",
        "trainer.logger=[jsonl]",
        "trainer.save_freq=-1",
        "trainer.resume=disable",
        "trainer.overwrite_output_dir=true",  # a re-run replaces (moves aside) the last one
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        f"trainer.output_dir={out}",
    ]
    return load_config(TrainConfig, str(CONFIG), [*fixed, *overrides])


def timed_generation(gen: Any, prompts: list[list[int]], params: SamplingParams, repeats: int):
    """One warm-up call, then ``repeats`` timed calls from the same seed."""
    runs = []
    for r in range(repeats + 1):
        torch.manual_seed(r)
        t0 = time.perf_counter()
        out: list[Completion] = gen.generate(prompts, params)
        seconds = time.perf_counter() - t0
        tokens = sum(len(c.token_ids) for c in out)
        if r > 0:
            runs.append({"seconds": seconds, "tokens": tokens, "tok_per_s": tokens / seconds})
    return {
        "runs": runs,
        "median_tok_per_s": statistics.median(x["tok_per_s"] for x in runs),
        "mean_response_tokens": statistics.mean(x["tokens"] for x in runs) / len(prompts),
    }


def generation_part(args: argparse.Namespace, overrides: list[str], engines: list) -> dict:
    """Tokens/s of both backends; the vLLM generator is left open in ``engines`` so the training
    part's vLLM trainer (same engine settings) shares its engine instead of starting another."""
    from toolgrpo.rollout.vllm_backend import VLLMGenerator

    cfg = train_config("vllm", 1, tempfile.mkdtemp(prefix="toolgrpo_genbench_"), overrides)
    d, r = cfg.data, cfg.actor_rollout_ref.rollout
    policy = load_policy(cfg.actor_rollout_ref.model, trainable=False)
    tasks = load_tasks(d.train_files, max_samples=args.prompts).tasks
    prompts = [render_prompt(policy.tokenizer, t.messages, d.max_prompt_length) for t in tasks]
    params = SamplingParams(
        n=1, temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, max_new_tokens=args.tokens
    )
    hf = HFGenerator(policy.model, policy.tokenizer, policy.dtype, r.generation_batch_size)
    res: dict[str, Any] = {
        "prompts": len(prompts),
        "mean_prompt_tokens": statistics.mean(len(p) for p in prompts),
        "max_new_tokens": args.tokens,
        "sampling": params.__dict__,
        "lora": policy.is_lora,  # HF samples the PEFT module as the trainer does; vLLM, merged
        "hf": {"dtype": str(policy.dtype), **timed_generation(hf, prompts, params, args.repeats)},
    }
    t0 = time.perf_counter()
    vllm = VLLMGenerator.from_config(cfg, policy)
    engines.append(vllm)
    res["vllm"] = {
        "dtype": str(vllm.llm.llm_engine.model_config.dtype),
        "engine_start_s": time.perf_counter() - t0,
        "first_sync_s": vllm.last_sync_s,
        **timed_generation(vllm, prompts, params, args.repeats),
    }
    res["speedup"] = res["vllm"]["median_tok_per_s"] / res["hf"]["median_tok_per_s"]
    return res


def training_part(args: argparse.Namespace, overrides: list[str]) -> dict[str, Any]:
    from toolgrpo.trainer.trainer import Trainer

    res = {}
    for backend in ("hf", "vllm"):
        out = tempfile.mkdtemp(prefix=f"toolgrpo_stepbench_{backend}_")
        trainer = Trainer(train_config(backend, args.steps, out, overrides))
        try:
            rows = [trainer.train_step(step) for step in range(1, args.steps + 1)]
        finally:
            trainer.close()
        measured = rows[1:] or rows  # the first step pays one-off costs
        med = {k: statistics.median(r.get(k, 0.0) for r in measured) for k in STEP_KEYS}
        med["gen_tok_per_s"] = med["tokens/generated"] / med["timing/gen_s"]
        res[backend] = {"steps_measured": len(measured), "median": med}
    hf_s, vllm_s = (res[b]["median"]["timing/step_s"] for b in ("hf", "vllm"))
    res["step_speedup"] = hf_s / vllm_s
    return res


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--prompts", type=int, default=16, help="first K RLLA train prompts")
    ap.add_argument("--tokens", type=int, default=128, help="max new tokens per sample")
    ap.add_argument("--repeats", type=int, default=3, help="timed generate calls after a warm-up")
    ap.add_argument("--steps", type=int, default=3, help="training steps per backend")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = as set)")
    ap.add_argument("--skip-train", action="store_true", help="generation part only")
    args, overrides = ap.parse_known_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    result: dict[str, Any] = {
        "config": str(CONFIG.name),
        "overrides": overrides,
        "machine": machine(torch.get_num_threads()),
    }
    engines: list[Any] = []
    try:
        result["generation"] = generation_part(args, overrides, engines)
        if not args.skip_train:
            result["training"] = training_part(args, overrides)
    finally:
        for e in engines:
            e.close()
    result["machine"]["load_avg_end"] = os.getloadavg()
    result["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2
    try:
        import vllm

        result["machine"]["vllm"] = vllm.__version__
    except ImportError:
        pass
    path = Path(__file__).parent / "results" / "generation.json"
    path.write_text(json.dumps(result, indent=1))
    print_table(result)
    print(f"wrote {path}")


def print_table(result: dict[str, Any]) -> None:
    g = result["generation"]
    t = Table(title=f"rollout generation, {g['prompts']} prompts × ≤{g['max_new_tokens']} tokens")
    for c in ("backend", "dtype", "gen tok/s", "step s", "step gen s", "weight sync s"):
        t.add_column(c)
    for b in ("hf", "vllm"):
        step = result.get("training", {}).get(b, {}).get("median", {})
        t.add_row(
            b,
            g[b]["dtype"],
            f"{g[b]['median_tok_per_s']:.1f}",
            f"{step['timing/step_s']:.1f}" if step else "-",
            f"{step['timing/gen_s']:.1f}" if step else "-",
            f"{step['timing/weight_sync_s']:.2f}" if step else "-",
        )
    Console().print(t)
    print(f"generation speed-up vLLM/HF: {g['speedup']:.2f}x", end="")
    if "training" in result:
        print(f"; step speed-up: {result['training']['step_speedup']:.2f}x", end="")
    print(f" (threads {result['machine']['torch_threads']}, flags {result['machine']['flags']})")


if __name__ == "__main__":
    main(sys.argv[1:])
