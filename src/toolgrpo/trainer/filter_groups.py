"""Dynamic sampling (DAPO; verl's ``algorithm.filter_groups``): a GRPO group whose samples all
score the same (and whose rolled-back failures, if any, score no lower) has zero advantage
everywhere, so it costs an update's compute and teaches nothing. With it on, a step keeps only
groups with signal and samples further batches of tasks until ``data.train_batch_size`` such
groups are in (or ``max_num_gen_batches`` batches were sampled; it then trains on the groups it
has, or, with none, on the first batch as it came).

Pure functions over batches (:func:`informative`, :func:`concat`) and one loop (:func:`fill`)
that calls back into the trainer for each further batch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import fields, replace

import torch

from toolgrpo.config.algorithm import FilterGroupsConfig
from toolgrpo.trainer.batch import Batch, uid_groups
from toolgrpo.trainer.rollout_stage import Rolled
from toolgrpo.trainer.sample_metrics import SAMPLED, recount

log = logging.getLogger(__name__)

EPS = 1e-6  # scores closer than this count as equal


def has_signal(scores: Sequence[float], negative: Sequence[bool]) -> bool:
    """Whether a group's advantages are not all 0: its real members' scores differ, or a
    rolled-back negative scores below their mean (the estimators give a negative
    min(0, s - mean of the real members) and leave it out of the baseline). A lone real member
    (its siblings' environments failed) has no spread: no signal, as in verl."""
    real = [s for s, neg in zip(scores, negative, strict=True) if not neg]
    if len(real) >= 2 and max(real) - min(real) > EPS:
        return True
    mean = sum(real) / len(real) if real else 0.0
    return bool(real) and any(
        s < mean - EPS for s, neg in zip(scores, negative, strict=True) if neg
    )


def informative(batch: Batch) -> tuple[list[list[int]], int]:
    """The groups with signal (:func:`has_signal`; row indices each), and how many groups the
    batch holds."""
    assert batch.scores_B is not None, "the batch is scored before it is filtered"
    scores = batch.scores_B.tolist()
    flags = batch.is_negative or [False] * batch.size
    groups = uid_groups(batch.uids)
    keep = [g for g in groups if has_signal([scores[i] for i in g], [flags[i] for i in g])]
    return keep, len(groups)


def _pad(t: torch.Tensor, left: int, right: int, value: float) -> torch.Tensor:
    return torch.nn.functional.pad(t, (left, right), value=value) if left or right else t


def concat(batches: Sequence[Batch], pad_id: int) -> Batch:
    """One batch of all rows: prompts left-padded to the widest prompt, responses right-padded
    to the longest response (the layout of trainer/batch.py), lists joined."""
    if len(batches) == 1:
        return batches[0]
    R = max(b.response_length for b in batches)
    P = max(b.input_ids_BT.shape[1] - b.response_length for b in batches)
    if len({b.old_source for b in batches}) > 1:
        raise ValueError("batches whose old log-probs come from different sources")
    out = {}
    for f in fields(Batch):
        vals = [getattr(b, f.name) for b in batches]
        if f.name == "old_source":
            continue
        if all(v is None for v in vals):
            out[f.name] = None
        elif any(v is None for v in vals):
            raise ValueError(f"{f.name} is set on some batches only")
        elif isinstance(vals[0], torch.Tensor):
            parts = []
            for b, v in zip(batches, vals, strict=True):
                r = b.response_length
                if f.name.endswith("_BT"):  # [prompt | response]: pad each side to its width
                    p = v.shape[1] - r
                    value = pad_id if f.name == "input_ids_BT" else 0
                    prompt, resp = v[:, :p], v[:, p:]
                    v = torch.cat([_pad(prompt, P - p, 0, value), _pad(resp, 0, R - r, value)], 1)
                elif f.name.endswith("_BR"):
                    v = _pad(v, 0, R - r, 0)
                parts.append(v)
            out[f.name] = torch.cat(parts, 0)
        else:  # per-row lists: every batch has them, or none does
            sizes_match = all(len(v) == b.size for b, v in zip(batches, vals, strict=True))
            if any(v for v in vals) and not sizes_match:
                raise ValueError(f"{f.name} is kept on some batches only")
            out[f.name] = [x for v in vals for x in v]
    return replace(batches[0], **out)


def merged_metrics(rounds: Sequence[Rolled]) -> tuple[dict[str, float], dict[str, float]]:
    """The metrics of every sampled batch, one value per key: seconds (``*_s``) summed over the
    batches, other values averaged (each batch holds the same number of tasks); timings summed."""
    keys = {k for r in rounds for k in r.metrics}
    metrics = {}
    for k in keys:
        vals = [float(r.metrics[k]) for r in rounds if k in r.metrics]
        metrics[k] = sum(vals) if k.endswith("_s") else sum(vals) / len(vals)
    timing: dict[str, float] = {}
    for r in rounds:
        for k, v in r.timing.items():
            timing[k] = timing.get(k, 0.0) + v
    return metrics, timing


def step_metrics(
    rounds: Sequence[Rolled], out: Batch | None
) -> tuple[dict[str, float], dict[str, float], float]:
    """The step's rollout metrics, timings and count of non-finite rewards. Each rollout metric
    is counted over the groups trained (``out``'s; the first batch's when every episode failed)
    under its own name, and over every batch sampled under ``sampled/``
    (trainer/sample_metrics.py); what describes the sampling itself (``ray/*``, ranks) is
    merged over the batches. A batch without its samples (on an FSDP2 rank other than 0, which
    logs nothing) leaves every metric merged."""
    metrics, timing = merged_metrics(rounds)
    parts = [r.samples for r in rounds if r.samples is not None]
    if len(parts) < len(rounds):
        return metrics, timing, sum(r.nonfinite for r in rounds)
    groups = set(out.uids) if out is not None else set(parts[0].uids)
    counted, nonfinite = recount(parts, groups)
    own = {k.removeprefix(SAMPLED) for k in counted if k.startswith(SAMPLED)}
    process = {k: v for k, v in metrics.items() if k not in own}  # not a rollout metric
    return {**process, **counted}, timing, nonfinite


def fill(
    sample: Callable[[int], Rolled], fg: FilterGroupsConfig, wanted: int, pad_id: int
) -> Rolled:
    """The step's batch: ``sample(k)`` rolls out the k-th batch of tasks (0 first). Without
    ``fg.enable`` it is batch 0 as it came; with it, the first ``wanted`` groups with signal
    (:func:`has_signal`), over as many batches as it takes (at most ``fg.max_num_gen_batches``
    when > 0)."""
    rounds = [sample(0)]
    if not fg.enable:
        return rounds[0]
    parts: list[Batch] = []
    have = seen = useful = 0
    while True:
        batch = rounds[-1].batch
        if batch is not None:
            groups, total = informative(batch)
            seen, useful = seen + total, useful + len(groups)
            groups = groups[: wanted - have]
            if groups:
                parts.append(batch.select([i for g in groups for i in g]))
                have += len(groups)
        cap = fg.max_num_gen_batches
        if have >= wanted or (cap > 0 and len(rounds) >= cap):
            break
        rounds.append(sample(len(rounds)))
    if parts:
        out = concat(parts, pad_id)
    else:  # no group with signal: the first batch, as without the filter (none if it failed)
        out = next((r.batch for r in rounds if r.batch is not None), None)
    if have < wanted:
        log.info(
            "filter_groups: %d of %d groups with signal after %d batches",
            have,
            wanted,
            len(rounds),
        )
    metrics, timing, nonfinite = step_metrics(rounds, out)
    metrics.update(
        {
            "filter_groups/num_gen_batches": float(len(rounds)),
            "filter_groups/kept_groups": float(have),
            "filter_groups/informative_frac": useful / seen if seen else 0.0,
            "train/skipped_update": float(out is None),
        }
    )
    return Rolled(out, metrics, timing, nonfinite)
