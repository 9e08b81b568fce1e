"""FSDP2 when rank 0's rollout fails (the async rollout thread's, or its own in the synchronous
loop): rank 0 raises the error at the step's broadcast, and the other ranks, waiting in that
broadcast, learn of it and raise too, instead of sitting there until rank 0's exit breaks the
connection (or gloo's 30-minute timeout). Each rank runs in its own process under a hard
deadline, so a hang fails the test instead of the CI job."""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import read_metrics
from tests.distributed import _rank_main, free_port
from tests.distributed.test_fsdp_async import _cfg

FAIL_AT = 2  # the rollout of this step raises
DEADLINE_S = 300.0  # the whole world, startup included (it takes ~15 s on 2 busy CPU cores)
PROMPT_S = 30.0  # rank 0's error to every rank's end (< 1 s; 60 s when rank 1 waited it out)


def _run(world: int, args: tuple, result: str) -> None:
    """One rank: a 3-step run whose rollout of step ``FAIL_AT`` raises (rank 0 alone samples,
    on its rollout thread with async); what ended it, and when, goes to ``result/rank<r>.pt``."""
    from toolgrpo.trainer.trainer import Trainer

    rank = int(os.environ["RANK"])
    real = Trainer.produce

    def produce(self, step, indices, generator=None, k=0):
        if step == FAIL_AT:
            raise ValueError(f"rollout of step {step} broke")
        return real(self, step, indices, generator, k)

    Trainer.produce = produce  # a spawned process: nothing to undo
    *paths, asynchronous = args
    extra = {  # rank 0 alone samples (async: on its rollout thread)
        "async_training.enable": str(asynchronous).lower(),
        "trainer.distributed.rollout_ranks": "auto" if asynchronous else "main",
    }
    trainer = Trainer(_cfg(*paths, world, **extra))
    outcome: dict = {"error": None}
    try:
        trainer.fit()
    except Exception as e:
        chain, cause = [], e
        while cause is not None:
            chain.append(f"{type(cause).__name__}: {cause}")
            cause = cause.__cause__ or cause.__context__
        outcome.update(error=type(e).__name__, chain=chain, raised_at=time.time())
        raise
    finally:
        try:
            trainer.close()
        finally:
            outcome["closed_at"] = time.time()
            torch.save(outcome, Path(result) / f"rank{rank}.pt")


def _world(args: tuple, result: Path, world: int = 2) -> tuple[list[int | None], list[dict]]:
    """Every rank in its own spawned process, killed at ``DEADLINE_S``: exit codes (None: it
    was still running, so killed) and what each rank saved."""
    ctx = multiprocessing.get_context("spawn")
    port = free_port()
    procs = [
        ctx.Process(target=_rank_main, args=(r, world, port, _run, args, str(result)))
        for r in range(world)
    ]
    for p in procs:
        p.start()
    end = time.monotonic() + DEADLINE_S
    for p in procs:
        p.join(max(0.0, end - time.monotonic()))
    codes = [p.exitcode for p in procs]
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    outcomes = [
        torch.load(f, weights_only=False) if (f := result / f"rank{r}.pt").exists() else {}
        for r in range(world)
    ]
    return codes, outcomes


@pytest.mark.parametrize("asynchronous", [True, False], ids=["async", "sync"])
def test_a_failed_rollout_on_rank0_ends_every_rank_with_an_error(
    tiny_model_dir, tiny_data, tmp_path, asynchronous
):
    out, result = tmp_path / "run", tmp_path / "outcomes"
    result.mkdir()
    codes, (zero, one) = _world((tiny_model_dir, tiny_data, out, 3, asynchronous), result)
    assert None not in codes, f"ranks still running after {DEADLINE_S:.0f} s: {codes}"
    assert all(c != 0 for c in codes), codes
    # rank 0 names the rollout's own error; the others say rank 0 failed
    assert any(f"rollout of step {FAIL_AT} broke" in m for m in zero["chain"]), zero
    assert one["error"] == "RankFailed", one
    assert one["chain"][0].startswith(f"RankFailed: rank 0 failed at step {FAIL_AT}: "), one
    assert f"rollout of step {FAIL_AT} broke" in one["chain"][0], one
    # promptly: no rank waits out a collective's timeout (a gloo broadcast, the exit barrier)
    last = max(zero["closed_at"], one["closed_at"])
    assert last - zero["raised_at"] < PROMPT_S, (zero, one)
    # the steps before the failed one were logged
    assert [m["step"] for m in read_metrics(out)] == list(range(1, FAIL_AT))
