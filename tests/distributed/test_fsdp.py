"""FSDP2 data-parallel update (issue #21): 2 gloo ranks on CPU against the one-process update.

Before this feature there was no sharded update at all: ``Actor`` had no ``ranks`` and the config
no ``trainer.distributed.strategy``, so each of these tests failed at import or config time.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.multiprocessing as mp

from tests.conftest import train_overrides
from tests.distributed import free_port
from toolgrpo.config.loader import load_config
from toolgrpo.config.schema import TrainConfig
from toolgrpo.trainer.batch import Batch

GROUPS, N, P, R = 4, 2, 6, 5


def _cfg(model_dir, data, out, lora: bool) -> TrainConfig:
    extra = {
        "data.train_batch_size": GROUPS,
        "actor_rollout_ref.rollout.n": N,
        "actor_rollout_ref.actor.ppo_mini_batch_size": GROUPS,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 1,
        "actor_rollout_ref.actor.use_kl_loss": "true",
        "actor_rollout_ref.actor.kl_loss_coef": 0.5,
        "actor_rollout_ref.actor.entropy_coeff": 0.01,
        "actor_rollout_ref.actor.optim.lr": 1e-2,
        "actor_rollout_ref.model.lora_rank": 4 if lora else 0,
        "trainer.device": "cpu",
    }
    return load_config(TrainConfig, None, train_overrides(model_dir, data, out, 1, **extra))


def _batch() -> Batch:
    """4 GRPO groups of 2 rows; rows of a group share a prompt; one row's tail is padding."""
    g = torch.Generator().manual_seed(3)
    prompts = torch.randint(10, 400, (GROUPS, P), generator=g).repeat_interleave(N, 0)
    resp = torch.randint(10, 400, (GROUPS * N, R), generator=g)
    mask = torch.ones(GROUPS * N, R)
    mask[1, 3:] = 0
    attn = torch.cat([torch.ones(GROUPS * N, P), mask], 1).long()
    lps = -torch.rand(GROUPS * N, R, generator=g) * 3 - 3
    b = Batch(torch.cat([prompts, resp], 1), attn, mask, lps)
    b.uids = [f"u{i // N}" for i in range(GROUPS * N)]
    b.old_logprobs_BR = lps
    b.ref_logprobs_BR = lps + 0.1 * torch.randn(GROUPS * N, R, generator=g)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 0.3, -0.3])
    b.advantages_BR = adv[:, None] * mask
    return b


def _rank(rank: int, world: int, port: int, args: tuple, out_file: str) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world)
    )
    torch.set_num_threads(1)
    import torch.distributed as dist

    from toolgrpo.distributed.fsdp import Ranks, leave_process_group
    from toolgrpo.distributed.sharded_load import actor_policy, start_policy
    from toolgrpo.trainer.actor import Actor
    from toolgrpo.trainer.parallel import refresh_rollout_copy

    dist.init_process_group("gloo")
    try:
        cfg = _cfg(*args)
        torch.manual_seed(0)  # the LoRA init, as in the one-process run
        ranks = Ranks(rank, world, True, torch.device("cpu"))
        # The sharded start: rank 0 whole (it samples), rank 1 empty; the actor's shards (and
        # the reference's, KL being on) are read from the files, each rank its rows.
        policy = start_policy(cfg.actor_rollout_ref.model, ranks)
        actor = Actor(actor_policy(policy, ranks), cfg, 10, ranks)
        b = _batch()
        old, _ = actor.compute_logprobs(b)
        ref, _ = actor.compute_logprobs(b, reference=True)
        metrics = actor.update(b)
        # The weight push's source: the shards gathered into rank 0's whole rollout copy.
        refresh_rollout_copy(actor, policy, ranks)
        weights = {k: v.detach().clone() for k, v in policy.model.named_parameters()}
        if rank == 0:
            torch.save({"old": old, "ref": ref, "metrics": metrics, "weights": weights}, out_file)
    finally:
        leave_process_group()


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_two_gloo_ranks_match_one_process(tiny_model_dir, tiny_data, tmp_path, lora):
    """Same global batch → same log-probs (actor and reference), same loss metrics and, after one
    optimizer step, the same weights as the one-process update (read from rank 0's rollout copy,
    which the shards are gathered into for sampling and the weight push); KL loss on. The ranks
    start sharded (shards read from the files); the resume test below starts from full loads."""
    from toolgrpo.models.loading import load_policy
    from toolgrpo.trainer.actor import Actor

    args = (tiny_model_dir, tiny_data, tmp_path / "run", lora)
    cfg = _cfg(*args)
    torch.manual_seed(0)
    actor = Actor(load_policy(cfg.actor_rollout_ref.model), cfg, 10)
    b = _batch()
    old, _ = actor.compute_logprobs(b)
    ref, _ = actor.compute_logprobs(b, reference=True)
    want = actor.update(b)
    weights = {k: v.detach() for k, v in actor.policy.model.named_parameters()}

    out_file = str(tmp_path / "rank0.pt")
    mp.spawn(_rank, args=(2, free_port(), args, out_file), nprocs=2, join=True)
    got = torch.load(out_file, weights_only=False)
    torch.testing.assert_close(got["old"], old, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got["ref"], ref, atol=1e-5, rtol=1e-5)
    for k in ("actor/loss", "actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm"):
        assert got["metrics"][k] == pytest.approx(want[k], rel=1e-4, abs=1e-6), k
    for name, w in weights.items():
        torch.testing.assert_close(got["weights"][name], w, atol=1e-5, rtol=1e-4)
    torch.manual_seed(0)
    start = load_policy(cfg.actor_rollout_ref.model)  # the step did move the weights
    assert any(not torch.allclose(p, weights[n]) for n, p in start.model.named_parameters())


def _rank_resume(rank: int, world: int, port: int, args: tuple, saved: str, out: str) -> None:
    """Load a one-process run's weights and optimizer state into the shards (the resume path),
    then take one more step."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world)
    )
    torch.set_num_threads(1)
    import torch.distributed as dist

    from toolgrpo.distributed.fsdp import (
        FsdpOptimizerView,
        Ranks,
        leave_process_group,
        load_full_into,
    )
    from toolgrpo.models.loading import load_policy
    from toolgrpo.trainer.actor import Actor
    from toolgrpo.trainer.config_diff import load_optimizer
    from toolgrpo.trainer.parallel import actor_policy, refresh_rollout_copy

    dist.init_process_group("gloo")
    try:
        cfg = _cfg(*args)
        policy = load_policy(cfg.actor_rollout_ref.model)  # unseeded: the load must overwrite
        ranks = Ranks(rank, world, True, torch.device("cpu"))
        actor = Actor(actor_policy(policy, ranks), cfg, 10, ranks)
        state = torch.load(saved, weights_only=False)
        load_full_into(actor.root, state["weights"] if rank == 0 else {})
        view = FsdpOptimizerView(actor.root, actor.optimizer)
        load_optimizer(view, actor.scheduler, state["optimizer"], state["scheduler"], saved)
        actor.update(_batch())
        refresh_rollout_copy(actor, policy, ranks)
        if rank == 0:
            weights = {k: v.detach().clone() for k, v in policy.model.named_parameters()}
            torch.save(weights, out)
    finally:
        leave_process_group()


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_one_process_state_resumes_on_two_ranks(tiny_model_dir, tiny_data, tmp_path, lora):
    """A step's trainable weights and position-keyed optimizer state (what a checkpoint holds)
    loaded into 2 ranks' shards continue exactly as the one process does: the next step's
    weights match, so weights and Adam moments both crossed the world-size change."""
    from toolgrpo.models.loading import load_policy
    from toolgrpo.trainer.actor import Actor

    args = (tiny_model_dir, tiny_data, tmp_path / "run", lora)
    cfg = _cfg(*args)
    torch.manual_seed(0)
    actor = Actor(load_policy(cfg.actor_rollout_ref.model), cfg, 10)
    actor.update(_batch())
    model = actor.policy.model
    saved = str(tmp_path / "state.pt")
    torch.save(
        {
            "weights": {n: p.detach().clone() for n, p in model.named_parameters()},
            "optimizer": actor.optimizer.state_dict(),
            "scheduler": actor.scheduler.state_dict(),
        },
        saved,
    )
    actor.update(_batch())
    want = {n: p.detach() for n, p in model.named_parameters()}

    out = str(tmp_path / "rank0.pt")
    mp.spawn(_rank_resume, args=(2, free_port(), args, saved, out), nprocs=2, join=True)
    got = torch.load(out, weights_only=False)
    for name, w in want.items():
        torch.testing.assert_close(got[name], w, atol=1e-5, rtol=1e-4)
