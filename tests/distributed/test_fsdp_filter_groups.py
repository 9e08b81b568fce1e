"""Dynamic sampling (``algorithm.filter_groups``) on 2 FSDP2 gloo ranks, every rank sampling its
share: each further batch is a collective, so every rank must take the same decisions. Greedy
decoding makes every group flat, so the step samples up to the cap, then trains the first batch;
the two ranks roll out, dump and train what one process does."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from tests.conftest import train_overrides
from tests.distributed import free_port
from toolgrpo.config.loader import load_config
from toolgrpo.config.schema import TrainConfig

CAP = 3


def _step(rank: int, world: int, port: int, model: str, data: str, out: str) -> None:
    import torch

    from toolgrpo.trainer.trainer import Trainer

    if world > 1:
        env = {"RANK": rank, "WORLD_SIZE": world, "LOCAL_RANK": rank, "MASTER_PORT": port}
        os.environ.update({"MASTER_ADDR": "127.0.0.1", **{k: str(v) for k, v in env.items()}})
    torch.set_num_threads(1)
    extra = {
        "algorithm.filter_groups.enable": "true",
        "algorithm.filter_groups.max_num_gen_batches": CAP,
        "actor_rollout_ref.actor.entropy_coeff": 0.01,  # a loss to compare: advantages are 0
        "trainer.rollout_data_dir": f"{out}/dump",
        "trainer.device": "cpu",
        "trainer.save_freq": -1,
        "trainer.distributed.strategy": "fsdp2" if world > 1 else "none",
        "trainer.distributed.rollout_ranks": "auto",  # every rank samples (the default)
    }
    cfg = load_config(TrainConfig, None, train_overrides(model, data, out, 1, **extra))
    trainer = Trainer(cfg)
    try:
        r = trainer.rollouts
        trainer.rollouts = replace(r, sampling=replace(r.sampling, do_sample=False))
        metrics = trainer.train_step(1)
        if trainer.ranks.main:
            Path(f"{out}/metrics.json").write_text(json.dumps(metrics))
    finally:
        trainer.close()


def _dump(out: Path) -> list[dict]:
    rows = [json.loads(x) for x in (out / "dump" / "1.jsonl").open()]
    return [{k: v for k, v in r.items() if k not in ("uid", "timing")} for r in rows]


def test_two_ranks_sample_as_many_batches_as_one_process_and_train_the_same(
    tiny_model_dir, tiny_data, tmp_path
):
    import torch.multiprocessing as mp

    one, two = tmp_path / "one", tmp_path / "two"
    _step(0, 1, 0, str(tiny_model_dir), str(tiny_data), str(one))
    args = (2, free_port(), str(tiny_model_dir), str(tiny_data), str(two))
    mp.spawn(_step, args=args, nprocs=2, join=True)
    want = json.loads((one / "metrics.json").read_text())
    got = json.loads((two / "metrics.json").read_text())
    for m in (want, got):
        assert m["filter_groups/num_gen_batches"] == CAP and m["filter_groups/kept_groups"] == 0
        assert m["batch/size"] == 4  # no group with signal: the first batch, 2 tasks x n=2
    assert got["rollout/sampling_ranks"] == 2.0
    assert len(_dump(one)) == 4 * CAP and _dump(two) == _dump(one)  # every batch, same tokens
    for k in ("actor/loss", "actor/entropy", "actor/grad_norm"):
        assert got[k] == pytest.approx(want[k], rel=1e-4, abs=1e-5), k
