"""``configs/all_systems.yaml`` (router with a budget, a fixed policy on a schedule, multi-turn
environments, rollback with negatives) trains 2 steps in one process and on 2 gloo ranks under
torchrun as it runs by default: every rank samples its share of the step's groups, the fixed
policy's among them (``rollout_ranks=auto``). With greedy decoding (top-k 1, for the actor and
the fixed policy) the step-1 losses and router / mixture metrics match one process's."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import read_metrics
from toolgrpo.config.loader import ConfigError, load_config
from toolgrpo.config.schema import TrainConfig
from toolgrpo.distributed.fsdp import check_strategy

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "all_systems.yaml"
MT = "actor_rollout_ref.rollout.multi_turn."

# One key per system: each must be logged every step, in one process and on two ranks.
SYSTEMS = {
    "router": ["router/lambda", "router/cost/mean", "router/pg_loss", "router/lambda_next"],
    "mixture": ["rollout/using_fixed", "rollout/alpha", "actor/importance_sampling"],
    "rollback": ["rollout/rollbacks", "rollout/negative_samples", "rollout/groups_with_negatives"],
    "update": ["actor/pg_loss", "actor/loss", "actor/kl_loss"],
}
# Step 1 sees the same batch (greedy, whichever rank samples a group) and the same weights.
EQUAL = [
    "actor/loss",
    "actor/pg_loss",
    "actor/kl_loss",
    "actor/entropy",
    "actor/grad_norm",
    "router/lambda",
    "router/cost/mean",
    "router/pg_loss",
    "router/lambda_next",
    "rollout/using_fixed",
    "actor/importance_sampling",
    "rollout/negative_samples",
    "reward/mean",
]


def _overrides(model, out: Path, ranks: int) -> list[str]:
    """The tiny random model in place of SmolLM2, as actor and fixed policy; 2 steps of 2
    groups of 2 episodes, short turns."""
    return [
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.model.dtype=float32",
        f"rollout_only.model_path={model}",
        "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.rollout.n=2",
        "data.train_batch_size=2",
        "data.max_samples=8",
        "data.max_prompt_length=4096",
        "data.max_response_length=48",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        # The tiny model solves nothing, so every advantage is 0: an entropy bonus gives the
        # update a loss and a gradient to compare.
        "actor_rollout_ref.actor.entropy_coeff=0.01",
        f"{MT}max_tokens_per_turn=12",
        f"{MT}max_tool_response_length=16",
        "trainer.total_training_steps=2",
        "trainer.save_freq=-1",
        "trainer.device=cpu",
        "trainer.logger=[jsonl]",
        f"trainer.output_dir={out}",
        f"trainer.distributed.strategy={'fsdp2' if ranks > 1 else 'none'}",
        # Greedy: each rank samples its share from a stream of its own, so only decoding that
        # draws nothing gives the one-process batch.
        "actor_rollout_ref.rollout.top_k=1",
        "rollout_only.top_k=1",
    ]


def _train(model, out: Path, ranks: int) -> list[dict]:
    ov = _overrides(model, out, ranks)
    if ranks == 1:
        cmd = [sys.executable, "-m", "toolgrpo.cli", "train", str(CONFIG), *ov]
    else:
        run = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks)]
        cmd = [*run, "--standalone", "--module", "toolgrpo.cli", "train", str(CONFIG), *ov]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return read_metrics(out)


def test_all_systems_one_process_and_two_ranks_agree(tiny_model_dir, tmp_path):
    one = _train(tiny_model_dir, tmp_path / "one", 1)
    two = _train(tiny_model_dir, tmp_path / "two", 2)
    for run in (one, two):
        assert [r["step"] for r in run] == [1, 2]
        for rec in run:
            for system, keys in SYSTEMS.items():
                for k in keys:
                    assert k in rec and math.isfinite(rec[k]), (system, k, rec["step"])
    # every rank sampled at every step: at step 1 the fixed policy drew both groups (one each);
    # at step 2 each policy drew one, and the deal runs on from one part of the mixture to the
    # next, so one rank played the actor's group and the other the fixed policy's
    assert [r["rollout/sampling_ranks"] for r in two] == [2.0, 2.0]
    assert [r["rollout/using_fixed"] for r in two] == [1.0, 0.5]
    # the routes rank 0 drew and the fixed rows' importance weights, whichever were logged
    drawn = [k for k in one[0] if k.startswith(("router/route_frac/", "actor/importance_"))]
    for k in EQUAL + drawn:
        assert two[0][k] == pytest.approx(one[0][k], rel=1e-4, abs=1e-5), k
    assert one[0]["actor/loss"] != 0.0 and one[0]["actor/grad_norm"] > 0.0  # something to match


def _cfg(**extra: str) -> TrainConfig:
    ov = ["trainer.distributed.strategy=fsdp2", *(f"{k}={v}" for k, v in extra.items())]
    return load_config(TrainConfig, str(CONFIG), ov)


def test_fsdp2_accepts_the_config_and_refuses_what_it_cannot_run_with_the_reason():
    check_strategy(_cfg())  # router, mixture, multi-turn, rollback with negatives
    with pytest.raises(ConfigError, match=r"router.lr=null \(.*own SGD with router.lr"):
        check_strategy(_cfg(**{"router.lr": "null"}))
    check_strategy(_cfg(**{"async_training.enable": "true"}))  # test_fsdp_async.py
    check_strategy(_cfg(**{"algorithm.adv_estimator": "gae"}))  # tests/distributed/test_fsdp_gae.py


def _negatives_cfg(model, data, out: Path, ranks: int) -> TrainConfig:
    """The same config on a scripted division task (``_negatives_run``), one step, λ = 0.5."""
    ov = _overrides(model, out, ranks) + [
        f"data.train_files=[{data}]",
        f"{MT}envs={{div: {{type: test_div, max_turns: 4}}}}",
        f"{MT}max_negative_samples_per_group=1",
        "data.max_response_length=600",
        f"{MT}max_tokens_per_turn=64",  # the scripted call in one turn
        f"{MT}max_tool_response_length=64",
        "rollout_allocation_schedule.type=constant",  # per group; this seed draws
        "rollout_allocation_schedule.alpha=0.5",  # the actor for group 1, fixed for group 2
        "rollout_allocation_schedule.seed=2",
        "trainer.total_training_steps=1",
        "router.lambda_init=0.5",  # the LM's advantages carry λ·cost from the first step
        # The scripted generator plays its script in call order, so rank 0 samples the whole
        # step here (the path of rollout_ranks=main, and of async training).
        "trainer.distributed.rollout_ranks=main",
    ]
    return load_config(TrainConfig, str(CONFIG), ov)


def _negatives_run(rank: int, world: int, port: int, args: tuple, result: str) -> None:
    """One rank (or the one process) of a step on scripted episodes; rank 0 saves its metrics."""
    import torch
    from transformers import AutoTokenizer

    from tests.rollout.test_rollback import ANSWER, BAD, GOOD, TASK, AttemptGenerator
    from toolgrpo.data.task import Task
    from toolgrpo.trainer.trainer import Trainer

    if world > 1:
        env = {"RANK": rank, "WORLD_SIZE": world, "LOCAL_RANK": rank, "MASTER_PORT": port}
        os.environ.update({"MASTER_ADDR": "127.0.0.1", **{k: str(v) for k, v in env.items()}})
    torch.set_num_threads(1)
    trainer = Trainer(_negatives_cfg(*args, world))
    try:
        # Only rank 0 samples. Its actor group: the first episode (routed ANSWER) answers, the
        # second divides by zero, which is rolled back (a negative) and retried; so the two
        # differ in tool cost too. The fixed policy samples the other group.
        if trainer.ranks.main:
            trainer.tasks = [Task(f"t{i}", TASK.messages, "2", "test", "div") for i in range(8)]
            tok = AutoTokenizer.from_pretrained(args[0])
            trainer.generator = AttemptGenerator(tok, {0: [ANSWER, BAD, GOOD], 1: [ANSWER]})
        history = trainer.fit()
        if trainer.ranks.main:
            torch.save(history, result)
    finally:
        trainer.close()


def test_negatives_router_and_fixed_rows_train_alike_on_two_ranks(
    tiny_model_dir, tiny_data, tmp_path
):
    """Real negatives (rolled-back calls), fixed-policy rows and routed prompts in one batch: the
    2-rank step's losses and negatives' advantages equal the one-process step's."""
    import socket

    import torch
    import torch.multiprocessing as mp

    want_file, got_file = str(tmp_path / "one.pt"), str(tmp_path / "two.pt")
    _negatives_run(0, 1, 0, (tiny_model_dir, tiny_data, tmp_path / "one"), want_file)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = (tiny_model_dir, tiny_data, tmp_path / "two")
    mp.spawn(_negatives_run, args=(2, port, args, got_file), nprocs=2, join=True)
    (want,), (got,) = torch.load(want_file), torch.load(got_file)
    assert want["rollout/negative_rows"] >= 1 and want["rollout/using_fixed"] > 0
    assert want["rollout/negative_advantage_mean"] < 0 and want["router/lm_cost_adv_abs"] > 0
    keys = ["rollout/negative_rows", "rollout/negative_advantage_mean", "router/cost/mean"]
    keys += ["router/lm_cost_adv_abs", "rollout/using_fixed", "actor/importance_weight_mean"]
    keys += ["actor/loss", "actor/pg_loss", "actor/grad_norm"]
    for k in keys:
        assert got[k] == pytest.approx(want[k], rel=1e-4, abs=1e-5), k
