"""The actor (and optional value head / reference policy): log-prob passes and the PPO update.

Losses come from ``toolgrpo.algos``; this module only slices the batch into mini/micro-batches,
trims padding, and weights micro-batch losses so the result equals the loss over the mini-batch.
"""

from __future__ import annotations

import math
from collections import defaultdict
from contextlib import nullcontext
from typing import Any

import torch

from toolgrpo import progress
from toolgrpo.algos import agg_loss, get_policy_loss, kl_loss, value_loss
from toolgrpo.config.schema import TrainConfig
from toolgrpo.distributed.fsdp import Ranks
from toolgrpo.distributed.sharded_load import shard_policy, start_policy
from toolgrpo.mixture.objective import FixedObjective, pop_grad_share
from toolgrpo.models.compiled import compile_training_blocks
from toolgrpo.models.loading import Policy, load_policy, trainable_parameters
from toolgrpo.models.logprobs import response_logprobs, shared_prefix_logprobs
from toolgrpo.trainer import rollout_correction
from toolgrpo.trainer.batch import Batch, microbatch_indices, minibatch_indices, prompt_groups
from toolgrpo.trainer.optim import clip_grad_norm, lr_factor


def _trim(b: Batch) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Drop columns that are padding in every row of a micro-batch (left of prompts, right of
    responses): the forward pass then costs what the longest row costs, not the whole batch."""
    P = b.input_ids_BT.shape[1] - b.response_length
    live = b.attention_mask_BT[:, :P].any(0).nonzero()
    start = int(live[0]) if len(live) else P - 1
    # Response width from attention, not the mask: multi-turn rows have mask-0 tool tokens inside.
    r = max(1, int(b.attention_mask_BT[:, P:].sum(1).max().item()))
    return b.input_ids_BT[:, start : P + r], b.attention_mask_BT[:, start : P + r], r


def _shared_prompt(ids: torch.Tensor, attn: torch.Tensor, r: int) -> torch.Tensor | None:
    """The common prompt of a micro-batch whose rows all share it (one GRPO group), else None."""
    prompt_ids, prompt_mask = ids[:, :-r], attn[:, :-r]
    if ids.shape[0] < 2 or not bool((prompt_mask == prompt_mask[:1]).all()):
        return None
    if not bool((prompt_ids == prompt_ids[:1]).all()):
        return None
    return prompt_ids[0][prompt_mask[0].bool()]


def _response_lengths(resp_attn: torch.Tensor) -> list[int]:
    """Tokens up to each row's last attended one (multi-turn rows attend their tool tokens too)."""
    idx = torch.arange(1, resp_attn.shape[1] + 1, device=resp_attn.device)
    return (resp_attn.bool() * idx).amax(1).tolist()


def _pad_right(x: torch.Tensor, width: int) -> torch.Tensor:
    return torch.nn.functional.pad(x, (0, width - x.shape[1]))


class Actor:
    def __init__(
        self, policy: Policy, cfg: TrainConfig, total_steps: int, ranks: Ranks | None = None
    ) -> None:
        """With ``ranks.sharded`` the policy is sharded in place (FSDP2) before the optimizer
        sees its parameters; every log-prob pass and update is then a collective of all ranks."""
        self.policy = policy
        self.cfg = cfg
        self.ranks = ranks or Ranks(device=policy.device)
        self.device = policy.device
        acfg = cfg.actor_rollout_ref.actor
        self.temperature = cfg.actor_rollout_ref.rollout.temperature
        self.chunk = acfg.logprob_chunk_size
        self.compile = acfg.use_torch_compile
        if self.compile:
            compile_training_blocks(policy.model)
        # a mixture's fixed-row terms (mixture/objective.py); None without a fixed policy
        self.fixed = FixedObjective.from_config(cfg) if cfg.rollout_only.model_path else None
        self.value_head: torch.nn.Linear | None = None
        if cfg.algorithm.adv_estimator == "gae":
            hidden = policy.base.config.hidden_size
            self.value_head = torch.nn.Linear(hidden, 1, device=self.device)
            torch.nn.init.zeros_(self.value_head.weight)
            torch.nn.init.zeros_(self.value_head.bias)
        self.root: torch.nn.Module | None = None
        if self.ranks.sharded:
            # An empty model (sharded start) is filled from the files, each rank its rows.
            self.root = shard_policy(policy, self.ranks, self.value_head)
        groups: list[dict[str, Any]] = [{"params": trainable_parameters(policy.model)}]
        if self.value_head is not None:
            groups.append({"params": list(self.value_head.parameters()), "lr": cfg.critic.lr})
        o = acfg.optim
        self.optimizer = torch.optim.AdamW(
            groups, lr=o.lr, betas=tuple(o.betas), weight_decay=o.weight_decay
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: lr_factor(s, o.lr_warmup_steps, total_steps, o)
        )
        self.ref: Policy | None = None
        self.needs_ref = acfg.use_kl_loss or cfg.algorithm.use_kl_in_reward
        # The reference is the starting policy. Only a freshly initialised LoRA equals its base
        # (adapter disabled); a run that starts from an adapter needs a frozen copy of it.
        m = cfg.actor_rollout_ref.model
        fresh_lora = policy.is_lora and policy.resolved.adapter_dir is None and not m.adapter_path
        self.ref_root: torch.nn.Module | None = None
        if self.needs_ref and not fresh_lora:
            if self.ranks.sharded:  # no rank samples from it: empty everywhere, then filled
                self.ref = start_policy(m, self.ranks, trainable=False, whole_on_main=False)
                self.ref_root = shard_policy(self.ref, self.ranks)
            else:
                self.ref = load_policy(m, trainable=False, device=self.device)

    # ---- no-grad passes -------------------------------------------------------------------
    @torch.no_grad()
    def compute_logprobs(
        self, batch: Batch, reference: bool = False, with_values: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs of the response tokens under the actor (or reference), micro-batched."""
        micro = self.cfg.actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu
        out = torch.zeros_like(batch.response_mask_BR)
        values = torch.zeros_like(batch.response_mask_BR) if with_values else None
        # Sharded: each rank scores its own groups, then a sum fills every rank's copy.
        micros = _padded(self.ranks, _group_micro(batch, micro, self.ranks))
        for rows, real in micros:
            lp, _, v = self._forward(batch.select(rows), reference, False, with_values)
            if not real:
                continue
            out[rows] = _pad_right(lp, batch.response_length).to(out.device)
            if values is not None and v is not None:
                values[rows] = _pad_right(v, batch.response_length).to(values.device)
        self.ranks.sum_(out)
        if values is not None:
            self.ranks.sum_(values)
        return out, values

    def _forward(self, mb: Batch, reference: bool, entropy: bool, values: bool):
        mb = mb.to(self.device)
        ids, attn, r = _trim(mb)
        policy = self.ref if (reference and self.ref is not None) else self.policy
        root = self.ref_root if (reference and self.ref is not None) else self.root
        ctx = (
            self.policy.model.disable_adapter() if reference and self.ref is None else nullcontext()
        )
        prompt = _shared_prompt(ids, attn, r)
        if self.ranks.sharded and not self.ranks.all_(prompt is not None):
            # One path for every rank, or their per-layer collectives would not pair up: rows
            # of a group may not share a prompt (the router conditions each rollout's opening).
            prompt = None
        # The LM head runs only at the policy's own tokens: nothing reads the others' log-probs.
        scored = mb.response_mask_BR[:, :r]

        def run():
            with ctx, policy.autocast():
                if prompt is not None:
                    res = shared_prefix_logprobs(
                        policy.base,
                        prompt,
                        ids[:, -r:],
                        self.temperature,
                        self.chunk,
                        entropy,
                        values,
                        # Sharded passes are collectives per layer call: every rank must make
                        # the same calls, so ranks keep one padded bucket per group.
                        response_lengths=None
                        if self.ranks.sharded
                        else _response_lengths(attn[:, -r:]),
                        target_mask=scored,
                        compile_head=self.compile,
                    )
                else:
                    res = response_logprobs(
                        policy.base,
                        ids,
                        attn,
                        r,
                        self.temperature,
                        self.chunk,
                        entropy,
                        values,
                        target_mask=scored,
                        compile_head=self.compile,
                    )
            v = None
            if values and self.value_head is not None:
                v = self.value_head(res.hidden_BR.float()).squeeze(-1)
            return res.logprobs_BR, res.entropy_BR, v

        # Sharded: through the FSDP root, whose forward gathers the weights the pass needs.
        return root(run) if root is not None else run()

    # ---- the update ------------------------------------------------------------------------
    def update(self, batch: Batch) -> dict[str, float]:
        """PPO epochs over mini-batches of whole groups; one optimizer step per mini-batch.

        ``batch.old_source`` "update" (old log-probs None): π_old is this update's own first
        pass, exact for one on-policy pass (``trainer/rollout_correction.py``). Unless the
        trainer recomputed π_old ("trainer"), the sampler/trainer mismatch is measured on the
        first mini-batch, the one pass that runs at θ_old."""
        acfg = self.cfg.actor_rollout_ref.actor
        self.policy.model.train()
        sums: dict[str, float] = defaultdict(float)
        grad_norms = []
        minis = minibatch_indices(batch.uids, max(1, acfg.ppo_mini_batch_size))
        first = _FirstPass(batch)
        with progress.phase("update", acfg.ppo_epochs * len(minis), "mini-batches"):
            self._epochs(batch, minis, sums, grad_norms, first)
        self.scheduler.step()
        count = max(sums.pop("_weight"), 1.0)
        skips = sums.pop("actor/nonfinite_grad_skips", 0.0)
        metrics = {k: v / count for k, v in sums.items()}
        metrics |= pop_grad_share(metrics)  # mixture/fixed_grad_share
        metrics["actor/grad_norm"] = sum(grad_norms) / max(len(grad_norms), 1)
        metrics["actor/lr"] = self.optimizer.param_groups[0]["lr"]
        metrics["actor/nonfinite_grad_skips"] = skips
        if batch.old_source != "trainer":
            lp, rows = first.gathered(self.ranks)
            metrics.update(rollout_correction.measure(self.cfg, lp, batch, rows))
        return metrics

    def _epochs(
        self,
        batch: Batch,
        minis: list[list[int]],
        sums: dict[str, float],
        grad_norms: list[float],
        first: _FirstPass,
    ) -> None:
        """PPO epochs × mini-batches; sums metrics and grad norms in place, and keeps the
        first mini-batch's log-probs (computed at θ_old) in ``first``."""
        acfg = self.cfg.actor_rollout_ref.actor
        for epoch in range(acfg.ppo_epochs):
            for m, rows in enumerate(minis):
                mini = batch.select(rows)
                self.optimizer.zero_grad(set_to_none=True)
                denom = _agg_count(mini.response_mask_BR, acfg.loss_agg_mode)
                micro = acfg.ppo_micro_batch_size_per_gpu
                # Sharded: every rank runs as many passes (FSDP's collectives pair up), padding
                # with zero-weight ones; FSDP averages gradients, so losses are scaled by world.
                mine = _padded(self.ranks, _group_micro(mini, micro, self.ranks))
                rank_sums: dict[str, float] = defaultdict(float)
                for micro_rows, real in mine:
                    mb = mini.select(micro_rows)
                    w = _agg_count(mb.response_mask_BR, acfg.loss_agg_mode) / max(denom, 1)
                    if not real:
                        w = 0.0
                    if w == 0 and not self.ranks.sharded:
                        continue
                    loss, got, lp = self._micro_loss(mb)
                    (loss * (w * self.ranks.world)).backward()
                    for k, v in got.items():
                        rank_sums[k] += v * w
                    if epoch == 0 and m == 0 and real:
                        first.keep([rows[i] for i in micro_rows], lp)
                for k, v in _sum_dict(self.ranks, rank_sums).items():
                    sums[k] += v
                sums["_weight"] += 1.0
                params = [p for g in self.optimizer.param_groups for p in g["params"]]
                norm = clip_grad_norm(params, acfg.grad_clip)
                if math.isfinite(float(norm)):
                    self.optimizer.step()
                else:
                    sums["actor/nonfinite_grad_skips"] += 1.0
                grad_norms.append(float(norm))
                progress.tick()

    def _micro_loss(self, mb: Batch) -> tuple[torch.Tensor, dict[str, float], torch.Tensor]:
        """The micro-batch's loss, its metrics, and its log-probs (detached)."""
        acfg = self.cfg.actor_rollout_ref.actor
        mb = mb.to(self.device)
        gae = self.value_head is not None
        lp, ent, values = self._forward(mb, False, True, gae)
        r = lp.shape[1]
        mask = mb.response_mask_BR[:, :r]
        if mb.old_source == "update":  # π_old is this pass (one on-policy pass): exact and free
            old = lp.detach()
            weights = rollout_correction.update_pass_weights(
                self.cfg, old, mb.rollout_logprobs_BR[:, :r], mask
            )
        else:
            old = mb.old_logprobs_BR[:, :r]
            weights = None if mb.is_weights_BR is None else mb.is_weights_BR[:, :r]
        scale = float(
            self.cfg.data.max_response_length
        )  # Dr.GRPO's constant, not the trimmed width
        low, high = rollout_correction.clip_band(self.cfg)
        agg, adv = acfg.loss_agg_mode, mb.advantages_BR[:, :r]
        kw = {"clip_ratio_low": low, "clip_ratio_high": high, "clip_ratio_c": acfg.clip_ratio_c}
        kw |= {"loss_agg_mode": agg, "loss_scale_factor": scale}
        kw |= {} if weights is None else {"is_weights_BT": weights}

        def policy(lp_: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
            """PPO's term, plus a mixture's shaped and guided terms on fixed rows."""
            pg, pm = get_policy_loss(acfg.policy_loss.loss_mode)(old, lp_, adv, mask, **kw)
            extra, em = self.fixed.terms(mb, lp_, mask, agg, scale) if self.fixed else (None, {})
            return (pg if extra is None else pg + extra), {**pm, **em}

        pg, pm = policy(lp)
        entropy = agg_loss(ent, mask, acfg.loss_agg_mode, scale)
        loss = pg - acfg.entropy_coeff * entropy
        metrics = {
            "actor/pg_loss": float(pg.detach()),
            "actor/entropy": float(entropy.detach()),
            "actor/clipfrac": pm["pg_clipfrac"],
            "actor/clipfrac_lower": pm["pg_clipfrac_lower"],
            "actor/ppo_kl": pm["ppo_kl"],
        }
        if self.fixed is not None:  # how much of the update the fixed rows get
            metrics |= self.fixed.grad_masses(lambda x: policy(x)[0], lp, mask, mb)
            metrics |= {k: v for k, v in pm.items() if k.startswith("mixture/")}
        if acfg.use_kl_loss:
            rows = None if self.fixed is None else self.fixed.kl_rows(mb)  # fixed_kl_loss
            kl = kl_loss(lp, mb.ref_logprobs_BR[:, :r], mask, acfg.kl_loss_type, agg, scale, rows)
            loss = loss + acfg.kl_loss_coef * kl
            metrics["actor/kl_loss"] = float(kl.detach())
        if gae and values is not None:
            vl, vclip = value_loss(
                values,
                mb.old_values_BR[:, :r],
                mb.returns_BR[:, :r],
                mask,
                self.cfg.critic.cliprange_value,
                acfg.loss_agg_mode,
            )
            loss = loss + self.cfg.critic.vf_coef * vl
            metrics["critic/vf_loss"] = float(vl.detach())
            metrics["critic/vf_clipfrac"] = vclip
        metrics["actor/loss"] = float(loss.detach())
        return loss, metrics, lp.detach()


class _FirstPass:
    """The log-probs of the update's first mini-batch, the one pass that runs at θ_old: the
    trainer's π_old of those rows, to measure the sampler's mismatch against at no extra cost."""

    def __init__(self, batch: Batch) -> None:
        self.lp_BR = torch.zeros_like(batch.response_mask_BR)
        self.rows_B = torch.zeros(batch.size, dtype=batch.response_mask_BR.dtype)

    def keep(self, rows: list[int], lp: torch.Tensor) -> None:
        self.lp_BR[rows] = _pad_right(lp.float(), self.lp_BR.shape[1]).to(self.lp_BR.device)
        self.rows_B[rows] = 1.0

    def gathered(self, ranks: Ranks) -> tuple[torch.Tensor, torch.Tensor]:
        """Every rank's rows (sharded: each row is kept by the one rank that owns its group)."""
        ranks.sum_(self.lp_BR)
        ranks.sum_(self.rows_B)
        return self.lp_BR, self.rows_B


def _group_micro(batch: Batch, micro: int, ranks: Ranks | None = None) -> list[list[int]]:
    """Micro-batches that never mix prompts, so each can share its prompt's forward pass; with
    ``ranks``, only this rank's whole groups."""
    groups = prompt_groups(batch)
    if ranks is not None:
        groups = ranks.mine(groups)
    return [chunk for g in groups for chunk in microbatch_indices(g, micro)]


def _padded(ranks: Ranks, micros: list[list[int]]) -> list[tuple[list[int], bool]]:
    """``(rows, real)``: this rank's micro-batches, padded with repeats marked not real up to
    the most any rank has (sharded passes are collectives, so every rank runs the same count)."""
    out = [(m, True) for m in micros]
    if not ranks.sharded:
        return out
    most = ranks.max_int(len(micros))
    filler = micros[0] if micros else [0]
    return out + [(filler, False)] * (most - len(micros))


def _sum_dict(ranks: Ranks, d: dict[str, float]) -> dict[str, float]:
    """A metric dict summed over ranks (same keys everywhere: every rank runs the same loss)."""
    if ranks.world == 1 or not d:
        return dict(d)
    keys = sorted(d)
    t = torch.tensor([d[k] for k in keys], dtype=torch.float64)
    ranks.sum_(t)
    return dict(zip(keys, t.tolist(), strict=True))


def _agg_count(mask: torch.Tensor, mode: str) -> float:
    """What a loss aggregation divides by: tokens for token-mean, non-empty sequences otherwise."""
    if mode == "token-mean":
        return float(mask.sum())
    return float((mask.sum(1) > 0).sum())
