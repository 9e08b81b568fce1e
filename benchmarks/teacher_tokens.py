"""How far did training move the actor towards the teacher's successful episodes?

Reads SFT rows of a fixed policy's successes (``mixture_teacher.py`` keeps them as
``teacher_seed<s>.jsonl``) and, for each model given, scores every assistant token of those
episodes teacher-forced (the tokens ``toolgrpo sft`` would train). Per model it reports, over all
assistant tokens and separately over each episode's final turn (where the answer is written) and
its earlier turns (the tool calls):

- ``logp_mean``: mean log-probability a token (the SFT loss, negated);
- ``low_frac``: share of tokens with probability below γ (where policy shaping's gradient weight
  γp/(p + γ)² is small: it is about p/γ for p ≪ γ);
- ``shaping_weight_mean``: the mean of γp/(p + γ)², LUFFY's weight with r = p;
- ``episode_logp_mean``: mean total log-probability of an episode's assistant tokens.

With ``--dumps`` (a mixed-group run's rollout dumps) and ``--metrics``, also ``advantage_mass``:
how the update's weight split between the teacher's successes, its failures and the actor's own
samples (``advantage_mass``'s docstring).

A model is an alias or directory (``smollm2-135m``) or a training checkpoint (``.../global_step_N``,
with its ``model/`` or LoRA ``adapter/``), optionally ``label=``-prefixed:

    python benchmarks/teacher_tokens.py \\
        --data benchmarks/results/mixture_teacher_kept/teacher_seed0.jsonl \\
        base=smollm2-135m teacher=smollm2-135m-agent \\
        mixed=outputs/mixture_teacher/mixed_shaped_seed0/checkpoints/global_step_16

Writes JSON (``--out``) with ``models``: label → the numbers above. A forward pass per episode and
model, no gradients: minutes on one core for a few dozen episodes of a 135M model.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from statistics import fmean
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from toolgrpo.algos.advantages import compute_grpo_advantages  # noqa: E402
from toolgrpo.algos.offpolicy import shaping_grad_weight  # noqa: E402
from toolgrpo.config.loader import load_config  # noqa: E402
from toolgrpo.config.schema import TrainConfig  # noqa: E402
from toolgrpo.eval.cli import apply_checkpoint  # noqa: E402
from toolgrpo.eval.episodes import success_threshold  # noqa: E402
from toolgrpo.models.loading import load_policy  # noqa: E402
from toolgrpo.models.logprobs import masked_token_logprobs  # noqa: E402
from toolgrpo.rollout.hf import stop_token_ids  # noqa: E402
from toolgrpo.sft.data import build_examples  # noqa: E402

CONFIG = ROOT / "configs" / "agent_smollm2_grpo.yaml"
PARTS = ("all", "final_turn", "earlier_turns")


def segments(mask: list[int]) -> list[tuple[int, int]]:
    """The [start, end) runs of 1s in a loss mask: one per assistant turn."""
    runs, start = [], None
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            runs.append((start, i))
            start = None
    return runs


def split_turns(mask: list[int]) -> dict[str, list[int]]:
    """Masks of the final assistant turn and of the earlier ones (same length as ``mask``)."""
    runs = segments(mask)
    final = [0] * len(mask)
    if runs:
        for k in range(*runs[-1]):
            final[k] = 1
    earlier = [a - b for a, b in zip(mask, final, strict=True)]
    return {"all": list(mask), "final_turn": final, "earlier_turns": earlier}


def picks(parts: dict[str, list[int]]) -> dict[str, torch.Tensor]:
    """For each part, which of the log-probs ``masked_token_logprobs`` returns for ``parts["all"]``
    (one per masked position after the first) belong to it."""
    every = parts["all"][1:]
    return {
        part: torch.tensor([a for a, b in zip(mask[1:], every, strict=True) if b], dtype=torch.bool)
        for part, mask in parts.items()
    }


def token_stats(logps: list[torch.Tensor], gamma: float) -> dict[str, float | None]:
    """The per-token numbers over tokens of several episodes (empty: None each)."""
    flat = torch.cat(logps) if logps else torch.zeros(0)
    if flat.numel() == 0:
        return {"tokens": 0, "logp_mean": None, "low_frac": None, "shaping_weight_mean": None}
    p = flat.exp()
    return {
        "tokens": int(flat.numel()),
        "logp_mean": float(flat.mean()),
        "low_frac": float((p < gamma).float().mean()),
        "shaping_weight_mean": float(shaping_grad_weight(p, gamma).mean()),
    }


def score_model(model: str, data: Path, gamma: float) -> dict[str, Any]:
    """Every number of the module docstring for one model on ``data``."""
    cfg = load_config(TrainConfig, str(CONFIG), [])
    m = cfg.actor_rollout_ref.model
    m.lora_rank = 0
    if Path(model).is_dir():  # a checkpoint, a model directory or an adapter
        apply_checkpoint(cfg, model)
    else:
        m.path, m.adapter_path = model, ""
    policy = load_policy(m, trainable=False)
    tok = policy.tokenizer
    ends = set(stop_token_ids(tok))
    examples, dropped = build_examples(tok, [str(data)], "ground_truth", 4096, ends)
    by_part: dict[str, list[torch.Tensor]] = {k: [] for k in PARTS}
    episode_logp = []
    with torch.no_grad(), policy.autocast():
        for ex in examples:
            ids = torch.tensor([ex.input_ids])
            parts = split_turns(ex.loss_mask)
            lp = masked_token_logprobs(
                policy.base, ids, torch.ones_like(ids), torch.tensor([parts["all"]])
            ).float()  # one value per masked position after the first token
            for part, pick in picks(parts).items():
                if pick.any():
                    by_part[part].append(lp[pick])
            episode_logp.append(float(lp.sum()))
    out: dict[str, Any] = {"episodes": len(examples), "dropped": dropped}
    out |= {part: token_stats(by_part[part], gamma) for part in PARTS}
    out["episode_logp_mean"] = fmean(episode_logp) if episode_logp else None
    return out


def advantage_mass(dumps: Path, metrics: Path | None = None) -> dict[str, Any]:
    """Where a mixed-group run's update put its weight: over every step's rollout dumps, each
    row's GRPO advantage (``compute_grpo_advantages``, std-normalized, rows of a group by uid)
    times its trained tokens, times the step's mean shaping weight on fixed rows
    (``mixture/shaping_grad_weight_mean`` from ``metrics``; 1 without it), as shares of the
    whole. With token-mean aggregation every token shares one denominator, so these shares are
    the shares of the loss's gradient weight that pull towards the fixed policy's successes,
    away from its failures, and away from (or towards) the actor's own samples."""
    weight: dict[int, float] = {}
    if metrics is not None:
        for line in metrics.read_text().splitlines():
            r = json.loads(line)
            if "mixture/shaping_grad_weight_mean" in r:
                weight[int(r["step"])] = float(r["mixture/shaping_grad_weight_mean"])
    mass: dict[str, float] = {}
    for path in sorted(dumps.glob("*.jsonl"), key=lambda q: int(q.stem)):
        rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        if not rows:
            continue
        scores = torch.tensor([float(r["reward"] or 0.0) for r in rows])
        adv, _ = compute_grpo_advantages(
            scores,
            torch.ones(len(rows), 1),
            [r["uid"] for r in rows],
            is_negative_B=[bool(r.get("negative")) for r in rows],
        )
        for r, a in zip(rows, adv[:, 0].tolist(), strict=True):
            fixed = r.get("policy", "actor") != "actor"
            ok = (r["reward"] or 0.0) >= success_threshold(r["task_type"])
            tokens = sum(s["tokens"] for s in r.get("spans", []) if s.get("trained"))
            w = weight.get(int(r["step"]), 1.0) if fixed else 1.0
            key = f"{'fixed' if fixed else 'actor'}_{'success' if ok else 'failure'}"
            mass[key] = mass.get(key, 0.0) + abs(a) * tokens * w
    total = sum(mass.values())
    return {k: v / total for k, v in sorted(mass.items())} if total else {}


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", help="[label=]alias, directory or checkpoint")
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--gamma", type=float, default=0.1)
    ap.add_argument("--dumps", type=Path, help="a mixed-group run's rollout_data: advantage_mass")
    ap.add_argument("--metrics", type=Path, help="that run's metrics.jsonl (shaping weights)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/teacher_tokens.json")
    args = ap.parse_args(argv)
    result: dict[str, Any] = {"data": str(args.data), "gamma": args.gamma, "models": {}}
    for spec in args.models:
        label, _, model = spec.rpartition("=")
        label = label or model
        stats = score_model(model, args.data, args.gamma)
        result["models"][label] = {"model": model, **stats}
        a = stats["all"]
        print(
            f"{label:12} tokens {a['tokens']:6}  logp {a['logp_mean']:.3f}  "
            f"p<γ {a['low_frac']:.2f}  shaping weight {a['shaping_weight_mean']:.3f}  "
            f"final turn logp {stats['final_turn']['logp_mean']:.3f}  "
            f"episode logp {stats['episode_logp_mean']:.1f}  "
            f"(perplexity {math.exp(-a['logp_mean']):.2f})",
            flush=True,
        )
    if args.dumps:
        result["advantage_mass"] = advantage_mass(args.dumps, args.metrics)
        print("advantage-weighted token mass:", result["advantage_mass"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main(sys.argv[1:])
