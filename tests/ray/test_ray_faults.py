"""Ray mode under failure: a worker killed mid-step, one that hangs past the call timeout, more
crashes than the restart budget, and an ordinary error raised in a worker."""

from __future__ import annotations

import pytest
import torch

from tests.ray.conftest import MOVING, all_finite, ray_overrides, train
from toolgrpo.config.loader import load_config
from toolgrpo.config.schema import TrainConfig
from toolgrpo.distributed.pool import RolloutPool
from toolgrpo.models.loading import load_policy
from toolgrpo.rollout.generator import SamplingParams
from toolgrpo.rollout.hf import HFGenerator

pytestmark = pytest.mark.ray

COMPARED = ("reward/mean", "tokens/generated", "response_length/mean", "actor/pg_loss")


def _kill_after_submit(pool) -> None:
    """ray.kill worker 1 right after its chunk of this call was sent: the call is in flight."""
    import ray

    orig = pool._submit

    def submit(job, timeout):
        ref = orig(job, timeout)
        if job.slot.index == 1 and job.method == "generate":
            pool._submit = orig
            ray.kill(job.slot.actor, no_restart=True)
        return ref

    pool._submit = submit


def test_a_worker_killed_mid_step_is_replaced_and_the_run_is_unchanged(
    clean_run, make_train_config, tmp_path
):
    """Kill a worker while step 2's rollout is in flight: every step completes, and since the
    re-queued chunk keeps its seed, the run equals the unbroken ``clean_run`` exactly. (A crash
    inside a worker, os._exit, is exercised by the restart-budget test below.)"""
    faults = {2: _kill_after_submit}
    cfg = make_train_config(steps=3, out=tmp_path / "broken", **ray_overrides(2), **MOVING)
    broken = train(cfg, faults)
    assert not faults, "a fault hook did not run"
    assert [r["step"] for r in broken.records] == [1, 2, 3]
    assert [r["ray/worker_restarts"] for r in broken.records] == [0.0, 1.0, 1.0]
    assert broken.records[-1]["ray/requeued_tasks"] >= 1
    assert all(r["ray/num_workers"] == 2.0 for r in broken.records)
    for a, b in zip(clean_run.records, broken.records, strict=True):
        all_finite(b)
        for key in COMPARED:
            assert a[key] == pytest.approx(b[key], abs=1e-6), (a["step"], key)
    for k, v in clean_run.weights.items():
        torch.testing.assert_close(broken.weights[k], v, rtol=0, atol=1e-6, msg=k)


# ---- the pool on its own: one pool for the checks below --------------------------------------
@pytest.fixture(scope="module")
def pool(ray_cluster, tiny_model_dir, tiny_data, tmp_path_factory):
    over = {
        "actor_rollout_ref.model.path": str(tiny_model_dir),
        "actor_rollout_ref.model.dtype": "float32",
        "data.train_files": f"[{tiny_data}]",
        "trainer.output_dir": str(tmp_path_factory.mktemp("pool")),
        **ray_overrides(2, **{"trainer.distributed.call_timeout_s": "8"}),
    }
    cfg = load_config(TrainConfig, None, [f"{k}={v}" for k, v in over.items()])
    p = RolloutPool(cfg)
    yield p
    p.close()


PROMPTS = [[1, 5, 9, 30 + i] for i in range(5)]


def _reset(pool, max_restarts: int) -> None:
    pool.restarts = pool.requeued = 0
    pool.dist.max_worker_restarts = max_restarts


def test_chunks_come_back_in_call_order_with_groups_intact(pool):
    """5 prompts × n=2 over 2 workers (chunks of 3 and 2): the local backend's order and ids."""
    params = SamplingParams(n=2, max_new_tokens=5, do_sample=False)
    remote = pool.generator.generate(PROMPTS, params)
    local_policy = load_policy(pool.cfg.actor_rollout_ref.model)
    p = local_policy
    local = HFGenerator(p.model, p.tokenizer, p.dtype).generate(PROMPTS, params)
    assert [c.prompt_index for c in remote] == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    for r, lo in zip(remote, local, strict=True):
        assert (r.prompt_index, r.prompt_ids, r.token_ids) == (
            lo.prompt_index,
            lo.prompt_ids,
            lo.token_ids,
        )
        torch.testing.assert_close(r.logprobs, lo.logprobs, rtol=0, atol=1e-4)


def test_sampling_is_reproducible_and_chunks_are_seeded_apart(pool):
    params = SamplingParams(n=2, max_new_tokens=5)
    runs = []
    for _ in range(2):
        torch.manual_seed(1234)  # what the trainer does before each step's rollout
        runs.append([c.token_ids for c in pool.generator.generate(PROMPTS[:4], params)])
    assert runs[0] == runs[1]
    torch.manual_seed(1234)
    again = [c.token_ids for c in pool.generator.generate(PROMPTS[:4], params)]
    later = [c.token_ids for c in pool.generator.generate(PROMPTS[:4], params)]
    assert again == runs[0] and later != again  # the second call of a step has its own seeds


def test_a_hung_worker_is_restarted_after_the_call_timeout(pool):
    _reset(pool, max_restarts=3)
    params = SamplingParams(n=1, max_new_tokens=3)
    pool.generator.generate(PROMPTS, params)  # warm: the first call may be slow
    pool.actors[0].inject_fault.remote("hang")
    torch.manual_seed(7)
    got = pool.generator.generate(PROMPTS, params)
    assert len(got) == len(PROMPTS)
    assert pool.restarts >= 1 and pool.requeued >= 1
    assert pool.metrics()["ray/worker_restarts"] >= 1


def test_an_error_raised_in_a_worker_propagates_without_restarts(pool):
    _reset(pool, max_restarts=3)
    pool.actors[1].inject_fault.remote("raise")
    with pytest.raises(ValueError, match="injected fault in worker 1"):
        pool.generator.generate(PROMPTS, SamplingParams(n=1, max_new_tokens=3))
    assert pool.restarts == 0
    assert len(pool.generator.generate(PROMPTS, SamplingParams(n=1, max_new_tokens=3))) == 5


def test_more_failures_than_max_worker_restarts_stop_the_run(pool):
    _reset(pool, max_restarts=1)
    for actor in pool.actors:
        actor.inject_fault.remote("exit")
    with pytest.raises(RuntimeError, match=r"max_worker_restarts.*last error: .*Actor"):
        pool.generator.generate(PROMPTS, SamplingParams(n=1, max_new_tokens=3))
    assert pool.restarts == 2
