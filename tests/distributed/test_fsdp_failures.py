"""A failure on any FSDP2 rank ends every rank within seconds, on the default path (every rank
samples its share: ``rollout_ranks=auto``): each rank prints the same line, naming the rank, the
step and the cause (the original exception's type and message), and exits with the same code.
Both directions: rank 1 failing in its own rollout while rank 0 samples or waits at the gather,
and rank 0 failing after the gather while rank 1 waits for the batch; the latter from a bug, from
too many environment failures (``EnvFailureError``) and from a non-finite reward, the last two
caused by rank 1's episodes. Each rank runs ``toolgrpo train`` (``cli.main``) in its own spawned
process under a hard deadline, so a hang fails the test instead of the CI job."""

from __future__ import annotations

import math
import multiprocessing
import os
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import read_metrics, train_overrides
from tests.distributed import free_port

FAIL_AT = 2  # the step whose work raises
DEADLINE_S = 300.0  # the whole world, start-up included (about a minute on 2 busy CPU cores)
PROMPT_S = 30.0  # from the failure to every rank's exit
MT = "actor_rollout_ref.rollout.multi_turn."
MULTI_TURN = {  # calculator episodes; the tiny model's turns end them, each with a reset
    "data.train_files": "[calculator:train]",
    "data.max_response_length": 48,
    f"{MT}enable": "true",
    f"{MT}envs": "{calculator: {max_turns: 2}}",
    f"{MT}max_tokens_per_turn": 8,
}
# case: (rank that raises, the cause its line names, the overrides of the run)
CASES = {
    "rank1_rollout": (1, "GenerationError: rank 1's engine died", {}),
    "rank0_after_gather": (0, "RuntimeError: collation broke", {}),
    "env_failure": (
        0,
        "EnvFailureError: step 2: 2 of 4 episodes failed",
        {
            **MULTI_TURN,
            f"{MT}max_env_failure_ratio": 0.25,  # rank 1's two episodes are too many
        },
    ),  # fmt: skip
    "nonfinite_reward": (0, "NonFiniteReward: non-finite reward nan", MULTI_TURN),
}


def _inject(case: str, rank: int, out: Path) -> None:
    """Make this rank fail as ``case`` says at step ``FAIL_AT`` (a spawned process: nothing to
    undo); the time of the failure goes to ``out/failed_at``."""
    from toolgrpo.envs.base import EnvReward
    from toolgrpo.envs.tool_env import ToolEnv
    from toolgrpo.rollout.generator import GenerationError
    from toolgrpo.rollout.hf import HFGenerator
    from toolgrpo.trainer import rollout_stage
    from toolgrpo.trainer.trainer import Trainer

    now: list[int] = [0]
    train_step = Trainer.train_step

    def step(self, step, producer=None):
        now[0] = step
        return train_step(self, step, producer)

    def failing() -> bool:
        if now[0] == FAIL_AT and not (out / "failed_at").exists():
            (out / "failed_at").write_text(repr(time.time()))
        return now[0] == FAIL_AT

    Trainer.train_step = step
    if case == "rank1_rollout" and rank == 1:
        generate = HFGenerator.generate

        def broken(self, prompts, params):
            if failing():
                raise GenerationError("rank 1's engine died")
            return generate(self, prompts, params)

        HFGenerator.generate = broken
    elif case == "rank0_after_gather" and rank == 0:
        collate = rollout_stage.collate

        def broken_collate(*args, **kwargs):
            if failing():
                raise RuntimeError("collation broke")
            return collate(*args, **kwargs)

        rollout_stage.collate = broken_collate
    elif case == "env_failure" and rank == 1:
        reset = ToolEnv.reset

        async def down(self):
            if failing():
                raise ConnectionError("calculator simulator down")
            return await reset(self)

        ToolEnv.reset = down
    elif case == "nonfinite_reward" and rank == 1:
        reward = ToolEnv.reward

        async def nan(self, transcript):
            return EnvReward(math.nan) if failing() else await reward(self, transcript)

        ToolEnv.reward = nan


def _rank(rank: int, world: int, port: int, case: str, argv: list[str], out: str) -> None:
    """One rank: ``toolgrpo train`` with its failure injected; its stderr to ``rank<r>.err``,
    its exit code the command's."""
    import torch

    env = {"RANK": rank, "WORLD_SIZE": world, "LOCAL_RANK": rank, "MASTER_PORT": port}
    os.environ.update({"MASTER_ADDR": "127.0.0.1", **{k: str(v) for k, v in env.items()}})
    torch.set_num_threads(1)
    sys.stderr = open(Path(out) / f"rank{rank}.err", "w", buffering=1)
    _inject(case, rank, Path(out))
    from toolgrpo.cli import main

    code = main(argv)
    sys.stderr.flush()
    sys.exit(code)


def _world(case: str, argv: list[str], out: Path, world: int = 2):
    """Every rank in its own process, killed at ``DEADLINE_S``: exit codes (None: still running,
    so killed), when each exited, and what each printed."""
    ctx = multiprocessing.get_context("spawn")
    port = free_port()
    procs = [
        ctx.Process(target=_rank, args=(r, world, port, case, argv, str(out))) for r in range(world)
    ]
    for p in procs:
        p.start()
    end = time.monotonic() + DEADLINE_S
    exited: list[float | None] = [None] * world
    while time.monotonic() < end and None in exited:
        for r, p in enumerate(procs):
            if exited[r] is None and p.exitcode is not None:
                exited[r] = time.time()
        time.sleep(0.05)
    codes = [p.exitcode for p in procs]
    for p in procs:
        if p.is_alive():
            p.kill()
        p.join()
    errs = [(out / f"rank{r}.err").read_text() for r in range(world)]
    return codes, exited, errs


@pytest.mark.parametrize("case", list(CASES))
def test_a_failure_on_any_rank_ends_every_rank_with_one_line(
    tiny_model_dir, tiny_data, tmp_path, case
):
    raiser, cause, extra = CASES[case]
    run = tmp_path / "run"
    ov = {
        "actor_rollout_ref.rollout.name": "hf",
        "trainer.device": "cpu",
        "trainer.distributed.strategy": "fsdp2",
        "trainer.save_freq": -1,
        **extra,
    }
    argv = ["train", *train_overrides(tiny_model_dir, tiny_data, run, 3, **ov)]
    codes, exited, errs = _world(case, argv, tmp_path)
    assert None not in codes, f"ranks still running after {DEADLINE_S:.0f} s: {codes}\n{errs}"
    # one line, the same on every rank, naming the rank, the step and the cause
    lines = [[x for x in e.splitlines() if x.startswith("toolgrpo train: error:")] for e in errs]
    assert all(len(ls) == 1 for ls in lines), errs
    assert lines[0] == lines[1], lines
    head = f"toolgrpo train: error: rank {raiser} failed at step {FAIL_AT}: {cause}"
    assert lines[0][0].startswith(head), (lines[0][0], errs)
    # the same exit code (a one-line error's), every rank within seconds of the failure
    assert codes == [2, 2], (codes, errs)
    failed_at = float((tmp_path / "failed_at").read_text())
    assert max(exited) - failed_at < PROMPT_S, (exited, failed_at)
    assert [m["step"] for m in read_metrics(run)] == list(range(1, FAIL_AT))
