"""Every FSDP2 rank samples its share (``trainer.distributed.rollout_ranks``, default all): whole
prompt groups round-robin, back on rank 0 in one process's order. With greedy decoding a 2-rank
step of ``configs/all_systems.yaml`` (router, fixed policy, multi-turn envs, rollback) rolls out
the same episodes and trains the same losses as one process; after the update every rank's
rollout copy holds the new weights."""

from __future__ import annotations

import json
import os
import socket
from dataclasses import replace
from pathlib import Path

import pytest

from tests.distributed.test_all_systems import CONFIG, _overrides
from toolgrpo.config.loader import ConfigError, load_config
from toolgrpo.config.schema import TrainConfig
from toolgrpo.config.validate import validate_train_config
from toolgrpo.distributed.fsdp import Ranks, rollout_on_all
from toolgrpo.distributed.rollout_share import RolloutShare, interleave


def test_whole_groups_round_robin_and_back_in_task_order():
    share = [RolloutShare(Ranks(rank=r, world=3)) for r in range(3)]
    tasks = list("abcdefg")
    assert [s.mine(tasks) for s in share] == [["a", "d", "g"], ["b", "e"], ["c", "f"]]
    rows = [f"{t}{k}" for t in tasks for k in range(2)]  # n = 2 samples a task, task-major
    mine = [s.my_rows(rows, 2) for s in share]
    assert mine[1] == ["b0", "b1", "e0", "e1"]
    assert interleave(mine, len(tasks), 2) == rows
    assert interleave([[], [], []], 0, 2) == []


def test_the_deal_runs_on_from_one_part_to_the_next():
    """A mixture's parts (the actor's tasks, then a fixed policy's) are dealt as one sequence,
    so with one group each the two ranks play one each; the next step starts at rank 0."""
    share = [RolloutShare(Ranks(rank=r, world=2)) for r in range(2)]
    for s in share:
        s._first = 1  # as after a first part of one task
    assert [s.mine(["b"]) for s in share] == [[], ["b"]]
    assert [s.mine(list("bcd")) for s in share] == [["c"], ["b", "d"]]
    assert interleave([["c0"], ["b0", "d0"]], 3, 1, first=1) == ["b0", "c0", "d0"]


def test_rank_share_counts_are_checked():
    with pytest.raises(ValueError, match="sampled 3 rows, expected 4"):
        RolloutShare(Ranks(rank=0, world=1)).gather(["x"] * 3, 2, 2)


def test_rollout_ranks_resolve_per_backend():
    def cfg(**kv):
        ov = ["trainer.distributed.strategy=fsdp2", *(f"{k}={v}" for k, v in kv.items())]
        return load_config(TrainConfig, str(CONFIG), ov)

    assert rollout_on_all(cfg())
    assert not rollout_on_all(cfg(**{"trainer.distributed.rollout_ranks": "main"}))
    assert not rollout_on_all(cfg(**{"trainer.distributed.backend": "ray"}))
    with pytest.raises(ConfigError, match="rollout_ranks=all with backend=ray"):
        both = {"trainer.distributed.backend": "ray", "trainer.distributed.rollout_ranks": "all"}
        rollout_on_all(cfg(**both))
    with pytest.raises(ConfigError, match="rollout_ranks"):
        validate_train_config(cfg(**{"trainer.distributed.rollout_ranks": "some"}))


def _greedy(trainer) -> None:
    """Greedy decoding for the actor and the fixed policy (training samples by default)."""
    rollouts = trainer.rollouts
    trainer.rollouts = replace(rollouts, sampling=replace(rollouts.sampling, do_sample=False))
    fixed = trainer.mixture.fixed if trainer.mixture is not None else None
    if fixed is not None:
        for label, spec in list(fixed.specs.items()):
            fixed.specs[label] = replace(spec, params=replace(spec.params, do_sample=False))


def _step(rank: int, world: int, port: int, model: str, out: str, result: str) -> None:
    """One greedy step of all_systems.yaml; each rank checks its rollout copy after the update."""
    import torch

    from toolgrpo.distributed.fsdp import full_tensors
    from toolgrpo.trainer.trainer import Trainer

    if world > 1:
        env = {"RANK": rank, "WORLD_SIZE": world, "LOCAL_RANK": rank, "MASTER_PORT": port}
        os.environ.update({"MASTER_ADDR": "127.0.0.1", **{k: str(v) for k, v in env.items()}})
    torch.set_num_threads(1)
    ov = _overrides(model, Path(out), world) + [
        "trainer.total_training_steps=1",
        "trainer.distributed.rollout_ranks=auto",  # every rank samples (the default)
        f"trainer.rollout_data_dir={out}/dump",
        "actor_rollout_ref.actor.optim.lr=1e-2",  # the weights visibly move in one update
    ]
    trainer = Trainer(load_config(TrainConfig, str(CONFIG), ov))
    try:
        _greedy(trainer)
        before = {n: p.detach().clone() for n, p in trainer.policy.model.named_parameters()}
        metrics = trainer.train_step(1)
        sync = {"rank": rank, "samples": trainer.ranks.samples}
        if trainer.actor.root is not None:  # every rank's copy against the gathered shards
            copy = dict(trainer.policy.model.named_parameters())
            diff, moved = 0.0, 0.0
            for name, full in full_tensors(trainer.actor.root, only_trainable=True):
                mine = copy[name.removeprefix("lm.")]
                diff = max(diff, (mine - full).abs().max().item())
                moved = max(moved, (mine - before[name.removeprefix("lm.")]).abs().max().item())
            sync.update(diff=diff, moved=moved)
        Path(f"{result}.rank{rank}.json").write_text(json.dumps(sync))
        if trainer.ranks.main:
            Path(result).write_text(json.dumps(metrics))
    finally:
        trainer.close()


def _dump(out: Path) -> list[dict]:
    rows = [json.loads(x) for f in sorted((out / "dump").glob("*.jsonl")) for x in f.open()]
    assert rows, f"no rollout dump under {out}"
    return [{k: v for k, v in r.items() if k not in ("uid", "timing")} for r in rows]


def test_two_ranks_each_play_their_groups_and_match_one_process(tiny_model_dir, tmp_path):
    import torch.multiprocessing as mp

    one, two = tmp_path / "one", tmp_path / "two"
    _step(0, 1, 0, str(tiny_model_dir), str(one), str(tmp_path / "one.json"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = (2, port, str(tiny_model_dir), str(two), str(tmp_path / "two.json"))
    mp.spawn(_step, args=args, nprocs=2, join=True)
    want = json.loads((tmp_path / "one.json").read_text())
    got = json.loads((tmp_path / "two.json").read_text())
    assert got["rollout/sampling_ranks"] == 2.0  # both ranks sent episodes
    assert "rollout/sampling_ranks" not in want
    # the same episodes, token for token, in the same order (route, policy, reward included)
    assert _dump(two) == _dump(one)
    for k in ("reward/mean", "router/cost/mean", "rollout/using_fixed", "actor/pg_loss"):
        assert got[k] == pytest.approx(want[k], rel=1e-4, abs=1e-5), k
    for k in ("actor/loss", "actor/entropy", "actor/grad_norm"):
        assert got[k] == pytest.approx(want[k], rel=1e-4, abs=1e-5), k
    for rank in (0, 1):
        sync = json.loads((tmp_path / f"two.json.rank{rank}.json").read_text())
        assert sync["samples"] is True
        assert sync["moved"] > 0 and sync["diff"] == 0.0, sync  # the update, in every copy
