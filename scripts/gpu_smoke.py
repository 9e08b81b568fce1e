"""Helper of scripts/gpu_smoke.sh: the steps that need Python, each printing its one-line summary
on stdout (or its reason on stderr, exit 1). The bash script times the steps and prints ok/FAIL.

Runs from the source tree (PYTHONPATH=src) with whatever torch the machine has: toolgrpo is not
installed on a bare GPU machine, and its torch pin would not match there anyway.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
from pathlib import Path


def _fail(msg: str) -> int:
    print(msg, file=sys.stderr)
    return 1


def _driver() -> str:
    """`` (driver N)`` from nvidia-smi where it is on the PATH: torch does not report it."""
    import shutil
    import subprocess

    if shutil.which("nvidia-smi") is None:
        return ""
    q = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader", "--id=0"]
    r = subprocess.run(q, capture_output=True, text=True, timeout=60)
    return f" (driver {r.stdout.strip()})" if r.returncode == 0 and r.stdout.strip() else ""


def cmd_env(a: argparse.Namespace) -> int:
    """Versions and device, then the tiny model (built here: a bare machine reaches no hub)."""
    import torch
    import transformers

    import toolgrpo
    from toolgrpo.models.loading import compute_dtype
    from toolgrpo.models.tiny import build_tiny_model_dir

    parts = [
        f"python {platform.python_version()}",
        f"torch {torch.__version__}",
        f"transformers {transformers.__version__}",
        f"toolgrpo {toolgrpo.__version__} from {Path(toolgrpo.__file__).parent}",
    ]
    if a.device == "cuda":
        if not torch.cuda.is_available():
            return _fail(f"--device cuda but torch {torch.__version__} sees no CUDA device")
        v = torch.cuda.nccl.version()  # a tuple in recent torch, an int in older ones
        nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        gpu = f"{torch.cuda.get_device_name(0)}{_driver()}"
        parts.insert(2, f"CUDA {torch.version.cuda}, {gpu}, NCCL {nccl}")
        dtype = compute_dtype("bfloat16", torch.device("cuda"))
    else:
        dtype = compute_dtype("auto", torch.device("cpu"))
    build_tiny_model_dir(a.model_dir)
    parts.append(f"compute dtype {str(dtype).removeprefix('torch.')}")
    Path(a.summary).write_text(", ".join(parts) + "\n")
    Path(a.summary).with_suffix(".dtype").write_text(str(dtype).removeprefix("torch."))
    devices = torch.cuda.device_count() if a.device == "cuda" else 0  # the 2-rank check's
    Path(a.summary).with_suffix(".devices").write_text(str(devices))
    return 0


def cmd_cli(a: argparse.Namespace) -> int:
    """``toolgrpo.cli.main`` in this process (the console script's entry point), so that what it
    did on the device can be read afterwards: the process group's backend and peak CUDA memory.
    Nothing in toolgrpo logs either, and a run that silently stayed on the CPU must not pass."""
    import torch
    import torch.distributed as dist

    from toolgrpo import cli

    seen: dict = {"backend": None}
    init = dist.init_process_group

    def recording_init(*args, **kwargs):
        seen["backend"] = kwargs.get("backend", args[0] if args else None)
        return init(*args, **kwargs)

    dist.init_process_group = recording_init
    rc = cli.main(a.rest[1:] if a.rest[:1] == ["--"] else a.rest)
    if os.environ.get("RANK", "0") == "0":
        cuda = torch.cuda.is_available()
        report = {
            "rc": rc,
            "backend": seen["backend"],
            "cuda_peak_mib": torch.cuda.max_memory_allocated() / 2**20 if cuda else 0.0,
        }
        Path(a.report).write_text(json.dumps(report))
    return rc


def _read_report(path: str, device: str) -> tuple[dict, str | None]:
    """The cli step's report and, on CUDA, why it does not show GPU work (None when it does)."""
    report = json.loads(Path(path).read_text())
    if device == "cuda" and report["cuda_peak_mib"] <= 0:
        return report, "no CUDA memory was allocated: it ran on the CPU"
    return report, None


def _fmt(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def cmd_check_train(a: argparse.Namespace) -> int:
    """Every step logged once with a finite loss, the last step's checkpoint whole, on the device
    and (FSDP2) the backend that was asked for."""
    report, off_device = _read_report(a.report, a.device)
    if off_device:
        return _fail(off_device)
    if a.backend and report["backend"] != a.backend:
        return _fail(f"process group backend {report['backend']}, expected {a.backend}")
    run = Path(a.run_dir)
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    steps = [r.get("step") for r in rows]
    if steps != list(range(1, a.steps + 1)):
        return _fail(f"metrics.jsonl has steps {steps}, expected 1..{a.steps}")
    losses = [r.get("actor/loss") for r in rows]
    if not all(isinstance(x, (int, float)) and math.isfinite(x) for x in losses):
        return _fail(f"actor/loss is not finite at every step: {losses}")
    ckpt = run / "checkpoints" / f"global_step_{a.steps}"
    if not (ckpt / "trainer_state.json").is_file():
        return _fail(f"no complete checkpoint at {ckpt}")
    moved = _max_weight_change(Path(a.init_model), ckpt / "model")
    if not moved > 0:
        return _fail(f"the checkpoint's weights equal the initial model's (max change {moved})")
    missing = [k for k in [*a.require, *a.expect] for r in rows if k not in r]
    if missing:
        return _fail(f"metrics missing at some step: {sorted(set(missing))}")
    for key, want in a.expect.items():
        got = [r[key] for r in rows]
        if any(g != want for g in got):
            return _fail(f"{key} is {got} over the steps, expected {want:g} at every step")
    last = rows[-1]
    parts = [
        f"loss={_fmt(last['actor/loss'])}",
        f"reward={_fmt(last.get('reward/mean'))}",
        f"grad_norm={_fmt(last.get('actor/grad_norm'))}",
    ]
    parts.append(f"max_weight_change={moved:.2g}")
    parts += [f"{k}={_fmt(last[k])}" for k in [*a.require, *a.expect]]
    if report["backend"]:
        parts.append(f"backend={report['backend']}")
    if a.device == "cuda":
        parts.append(f"cuda_peak={report['cuda_peak_mib']:.0f}MiB")
    parts.append(f"ckpt={ckpt.name}")
    print(" ".join(parts))
    return 0


def _max_weight_change(before: Path, after: Path) -> float:
    """Largest absolute change of any weight: an update that ran but moved nothing (a zero
    gradient, a step that was skipped) would otherwise pass."""
    from safetensors.torch import load_file

    old = load_file(str(before / "model.safetensors"))
    new = load_file(str(after / "model.safetensors"))
    common = old.keys() & new.keys()
    if not common:
        raise SystemExit(f"{after} shares no tensor name with {before}")
    return max((new[k].float() - old[k].float()).abs().max().item() for k in common)


def cmd_rollout_keys(a: argparse.Namespace) -> int:
    """The last step's ``rollout/*`` metrics: the sampler's recorded log-probs against the
    trainer's recomputed ones, where the trainer logs that comparison."""
    lines = [x for x in (Path(a.run_dir) / "metrics.jsonl").read_text().splitlines() if x.strip()]
    last = json.loads(lines[-1])
    keys = sorted(k for k in last if k.startswith("rollout/"))
    print(" ".join(f"{k}={_fmt(last[k])}" for k in keys) or "no rollout/* keys in metrics.jsonl")
    return 0


def cmd_check_eval(a: argparse.Namespace) -> int:
    report, off_device = _read_report(a.report, a.device)
    if off_device:
        return _fail(f"eval {off_device} although trainer.device=cuda")
    res = json.loads(Path(a.result).read_text())
    if res.get("num_tasks") != a.tasks:
        return _fail(f"eval scored {res.get('num_tasks')} tasks, expected {a.tasks}")
    keys = ("num_tasks", "reward_mean", "format_rate")
    parts = [f"{k}={_fmt(res.get(k))}" for k in keys]
    if a.device == "cuda":
        parts.append(f"cuda_peak={report['cuda_peak_mib']:.0f}MiB")
    print(" ".join(parts))
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("env")
    s.add_argument("--device", choices=("cuda", "cpu"), required=True)
    s.add_argument("--model-dir", required=True)
    s.add_argument("--summary", required=True, help="where the one-line summary goes")
    s.set_defaults(func=cmd_env)
    s = sub.add_parser("cli")
    s.add_argument("--report", required=True, help="JSON written by rank 0: backend, CUDA peak")
    s.add_argument("rest", nargs=argparse.REMAINDER, help="-- toolgrpo arguments")
    s.set_defaults(func=cmd_cli)
    s = sub.add_parser("check-train")
    s.add_argument("run_dir")
    s.add_argument("--report", required=True)
    s.add_argument("--device", choices=("cuda", "cpu"), required=True)
    s.add_argument("--steps", type=int, required=True)
    s.add_argument("--init-model", required=True, help="the model the run started from")
    s.add_argument("--backend", default=None, help="the process group's expected backend")
    s.add_argument(
        "--require",
        type=lambda x: [k for k in x.split(",") if k],
        default=[],
        help="comma-separated metric keys every step must log",
    )
    s.add_argument(
        "--expect",
        type=lambda x: {k: float(v) for k, v in (kv.split("=", 1) for kv in x.split(",") if kv)},
        default={},
        help="comma-separated key=value: the value every step must log for the key",
    )
    s.set_defaults(func=cmd_check_train)
    s = sub.add_parser("rollout-keys")
    s.add_argument("run_dir")
    s.set_defaults(func=cmd_rollout_keys)
    s = sub.add_parser("check-eval")
    s.add_argument("result")
    s.add_argument("--report", required=True)
    s.add_argument("--device", choices=("cuda", "cpu"), required=True)
    s.add_argument("--tasks", type=int, required=True)
    s.set_defaults(func=cmd_check_eval)
    a = p.parse_args()
    return a.func(a)


if __name__ == "__main__":
    sys.exit(main())
