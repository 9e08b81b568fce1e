"""The training batch: right-padded ``[B, P + R]`` tensors built from completions by pure functions.

Layout (verl's): prompts left-padded to a shared width P, responses right-padded to R, so response
token ``j`` of every row sits at column ``P + j`` and ``response_mask_BR`` marks which are real.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace

import torch

from toolgrpo.rollout.episode import Episode
from toolgrpo.rollout.generator import Completion


@dataclass
class Batch:
    input_ids_BT: torch.Tensor
    attention_mask_BT: torch.Tensor
    response_mask_BR: torch.Tensor  # float, 1 = a token the policy sampled
    rollout_logprobs_BR: torch.Tensor  # log-probs under the sampling distribution
    scores_B: torch.Tensor | None = None
    old_logprobs_BR: torch.Tensor | None = None
    ref_logprobs_BR: torch.Tensor | None = None
    old_values_BR: torch.Tensor | None = None
    advantages_BR: torch.Tensor | None = None
    returns_BR: torch.Tensor | None = None
    is_weights_BR: torch.Tensor | None = None  # detached per-token IS multipliers (TIS)
    shaping_BR: torch.Tensor | None = None  # 1: token trained by policy shaping (mixture)
    uids: list[str] = field(default_factory=list)
    task_types: list[str] = field(default_factory=list)
    is_negative: list[bool] = field(default_factory=list)  # rolled-back attempts (rollback.py)
    truncated: list[bool] = field(default_factory=list)  # cut-off episodes (mask_truncated)
    policies: list[str] = field(default_factory=list)  # who sampled each row; empty = actor
    # whose log-probs old_logprobs_BR holds (trainer/rollout_correction.py): "trainer" (a pass
    # before the update), "rollout" (the sampler's), "update" (None: the update's own pass)
    old_source: str = "trainer"

    @property
    def size(self) -> int:
        return self.input_ids_BT.shape[0]

    @property
    def response_length(self) -> int:
        return self.response_mask_BR.shape[1]

    def to(self, device: torch.device) -> Batch:
        """Every tensor on ``device`` (trainer.device); lists stay as they are."""
        updates = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, torch.Tensor):
                updates[f.name] = v.to(device)
        return replace(self, **updates)

    def select(self, idx: Sequence[int]) -> Batch:
        """Rows ``idx`` of every tensor and list (mini- and micro-batches)."""
        index = torch.as_tensor(list(idx), dtype=torch.long)
        updates = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, torch.Tensor):
                updates[f.name] = v.index_select(0, index)
            elif isinstance(v, list) and v:
                updates[f.name] = [v[i] for i in idx]
        return replace(self, **updates)


def collate(completions: Sequence[Completion], uids: Sequence[str], pad_id: int) -> Batch:
    """Stack single-turn completions into padded tensors (every response token was sampled)."""
    if len(completions) != len(uids):
        raise ValueError("one uid per completion is required")
    rows = [(c.prompt_ids, c.token_ids, [1] * len(c.token_ids), c.logprobs) for c in completions]
    return collate_rows(rows, uids, pad_id)


def collate_episodes(
    episodes: Sequence[Episode], pad_id: int, with_negatives: bool = False
) -> Batch:
    """Stack multi-turn episodes: tool results and turn markers sit in the response with mask 0.
    ``with_negatives`` appends each episode's negative samples after all episodes, as rows with
    the parent's uid, so GRPO ranks them inside the parent's group; fission's continuations
    (``Episode.forks``) follow, as rows of their own groups (``negative_parents`` gives the
    parents of both)."""
    negs = [n for e in episodes for n in e.negatives] if with_negatives else []
    forks = [f for e in episodes for f in e.forks]
    items = [*episodes, *negs, *forks]
    rows = [(x.prompt_ids, x.response_ids, x.response_mask, x.logprobs) for x in items]
    batch = collate_rows(rows, [x.uid for x in items], pad_id)
    batch.task_types = [x.task_type for x in items]
    batch.is_negative = [False] * len(episodes) + [True] * len(negs) + [False] * len(forks)
    return batch


def negative_parents(episodes: Sequence[Episode]) -> list[int]:
    """For each row ``collate_episodes`` appends after the episodes (negatives, then fission's
    continuations), the index of its parent episode (to extend any per-episode list, e.g. who
    sampled it, over those rows)."""
    negs = [i for i, e in enumerate(episodes) for _ in e.negatives]
    return negs + [i for i, e in enumerate(episodes) for _ in e.forks]


Row = tuple[Sequence[int], Sequence[int], Sequence[int], Sequence[float]]


def collate_rows(rows: Sequence[Row], uids: Sequence[str], pad_id: int) -> Batch:
    """``(prompt_ids, response_ids, response_mask, logprobs)`` rows → a batch; an empty response
    keeps one masked pad column."""
    if len(rows) != len(uids):
        raise ValueError("one uid per row is required")
    P = max(len(r[0]) for r in rows)
    R = max(1, max(len(r[1]) for r in rows))
    B = len(rows)
    ids = torch.full((B, P + R), pad_id, dtype=torch.long)
    attn = torch.zeros((B, P + R), dtype=torch.long)
    resp_mask = torch.zeros((B, R), dtype=torch.float32)
    lps = torch.zeros((B, R), dtype=torch.float32)
    for i, (prompt, resp, mask, logprobs) in enumerate(rows):
        p, r = len(prompt), len(resp)
        if not len(mask) == len(logprobs) == r:
            raise ValueError(f"row {i}: {r} response ids, {len(mask)} mask, {len(logprobs)} lps")
        ids[i, P - p : P] = torch.tensor(list(prompt), dtype=torch.long)
        attn[i, P - p : P] = 1
        if r:
            ids[i, P : P + r] = torch.tensor(list(resp), dtype=torch.long)
            attn[i, P : P + r] = 1
            resp_mask[i, :r] = torch.tensor(list(mask), dtype=torch.float32)
            lps[i, :r] = torch.tensor(list(logprobs), dtype=torch.float32)
    return Batch(ids, attn, resp_mask, lps, uids=list(uids))


def uid_groups(uids: Sequence[str]) -> list[list[int]]:
    """Row indices of each GRPO group (rows sharing a uid; rolled-back negatives share their
    parent's), in first-seen order."""
    order: dict[str, list[int]] = {}
    for i, u in enumerate(uids):
        order.setdefault(u, []).append(i)
    return list(order.values())


def minibatch_indices(uids: Sequence[str], groups_per_minibatch: int) -> list[list[int]]:
    """Split row indices into mini-batches of whole GRPO groups (a group never straddles two)."""
    groups = uid_groups(uids)
    step = max(1, groups_per_minibatch)
    return [sum(groups[s : s + step], []) for s in range(0, len(groups), step)]


def microbatch_indices(rows: Sequence[int], micro_size: int) -> list[list[int]]:
    rows = list(rows)
    return [rows[s : s + micro_size] for s in range(0, len(rows), max(1, micro_size))]


def prompt_groups(batch: Batch) -> list[list[int]]:
    """Row indices grouped by identical prompt tokens, in first-seen order."""
    P = batch.input_ids_BT.shape[1] - batch.response_length
    groups: dict[tuple[int, ...], list[int]] = {}
    for i in range(batch.size):
        key = tuple(batch.input_ids_BT[i, :P][batch.attention_mask_BT[i, :P].bool()].tolist())
        groups.setdefault(key, []).append(i)
    return list(groups.values())
