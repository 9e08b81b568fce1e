"""What each step metric counts under dynamic sampling: the names as without it count the groups
trained, ``sampled/`` names every rollout of every batch sampled. New: before, rollout metrics
were averaged over every batch sampled under the same names as the trained batch's ``reward/*``,
so ``reward/first_try_mean`` and ``reward/mean`` disagreed with nothing repaired."""

from __future__ import annotations

import pickle
from statistics import fmean

import pytest
import torch

from toolgrpo.config.algorithm import FilterGroupsConfig
from toolgrpo.rollout.episode import Episode
from toolgrpo.rollout.rollback import RollbackStats
from toolgrpo.trainer.batch import collate_episodes
from toolgrpo.trainer.filter_groups import fill
from toolgrpo.trainer.metrics import batch_metrics
from toolgrpo.trainer.rollout_stage import Rolled
from toolgrpo.trainer.sample_metrics import Samples, join

ON = FilterGroupsConfig(enable=True, max_num_gen_batches=4)


def _ep(uid: str, task_type: str, reward: float, **kw) -> Episode:
    return Episode(
        task_id=uid,
        task_type=task_type,
        uid=uid,
        prompt_ids=[1, 2, 3],
        response_ids=[4, 5],
        response_mask=[1, 1],
        logprobs=[-0.1, -0.2],
        reward=reward,
        num_turns=1,
        tool_calls=kw.pop("tool_calls", 1),
        **kw,
    )


def _rolled(eps: list[Episode], nonfinite: list[bool] | None = None) -> Rolled:
    """A batch of episodes as the rollout stage makes it (failed episodes left out)."""
    trained = [e.env_failure is None for e in eps]
    kept = [e for e, t in zip(eps, trained, strict=True) if t]
    batch = collate_episodes(kept, pad_id=0) if kept else None
    if batch is not None:
        batch.scores_B = torch.tensor([e.reward for e in kept])
    bad = nonfinite or [False] * len(eps)
    s = Samples([e.uid for e in eps], [e.task_type for e in eps], trained, bad, episodes=eps)
    extra = {"ray/rollout_wall_s": 2.0, "rollout/sampling_ranks": 2.0, "train/skipped_update": 0}
    return Rolled(batch, {**s.metrics(), **extra}, {"timing/gen_s": 1.5}, sum(bad), samples=s)


BATCH_0 = [  # a: flat (no signal); b: signal
    _ep("a", "calc", 1.0),
    _ep("a", "calc", 1.0, tool_calls=3),
    _ep("b", "direct", 0.0),
    _ep("b", "direct", 0.75),
]
BATCH_1 = [  # c: signal; d: flat, one of its episodes failed in its environment
    _ep("c", "calc", 0.5),
    _ep("c", "calc", 0.0),
    _ep("d", "direct", 0.0),
    _ep("d", "direct", 0.0, env_failure="boom"),
]


def _step(rounds: list[Rolled]) -> tuple[dict[str, float], Rolled]:
    """The step's logged metrics, as the trainer joins them: the batch's, then the rollout's."""
    got = fill(lambda k: rounds[k], ON, 2, 0)
    return {**batch_metrics(got.batch, got.timing, {}, 0), **got.metrics}, got


def test_first_try_mean_is_the_mean_when_nothing_was_repaired_in_either_set():
    m, got = _step([_rolled(BATCH_0), _rolled(BATCH_1, [False, False, True, False])])
    assert got.batch.uids == ["b", "b", "c", "c"]
    assert m["reward/first_try_mean"] == pytest.approx(m["reward/mean"]) == 1.25 / 4
    for t in ("calc", "direct"):
        assert m[f"reward/{t}/first_try_mean"] == pytest.approx(m[f"reward/{t}/mean"])
    assert "reward/repaired_mean" not in m
    real = [e.reward for e in BATCH_0 + BATCH_1 if e.env_failure is None]
    sampled = m["sampled/reward/first_try_mean"]
    assert sampled == pytest.approx(m["sampled/reward/mean"]) == pytest.approx(fmean(real))
    assert m["sampled/reward/calc/first_try_mean"] == pytest.approx(m["sampled/reward/calc/mean"])
    assert m["sampled/reward/direct/first_try_mean"] == 0.25  # b, and d's episode that stood


def test_each_metric_counts_the_set_its_name_says():
    m, got = _step([_rolled(BATCH_0), _rolled(BATCH_1, [False, False, True, False])])
    # the groups trained (b, c): every rollout metric, recounted
    assert m["episode/reward/mean"] == pytest.approx(1.25 / 4)
    assert m["episode/tool_calls/mean"] == 1.0  # a's 3 calls are not in a trained group
    assert m["rollout/env_failures"] == 0.0 and m["rollout/dropped_episodes"] == 0.0
    assert m["reward/groups_all_equal_frac"] == 0.0
    assert got.nonfinite == 0.0  # d's non-finite reward was sampled, not trained
    # every rollout of both batches
    assert m["sampled/episode/tool_calls/mean"] == pytest.approx(9 / 7)
    assert m["sampled/rollout/env_failures"] == 1.0 and m["sampled/rollout/dropped_episodes"] == 1
    assert m["sampled/reward/groups_all_equal_frac"] == 0.5  # a and d
    assert m["sampled/reward/nonfinite"] == 1.0
    assert m["sampled/reward/max"] == 1.0 and m["reward/max"] == 0.75
    # the sampling itself: seconds summed over the batches, the rest averaged
    assert m["ray/rollout_wall_s"] == 4.0 and m["rollout/sampling_ranks"] == 2.0
    assert got.timing["timing/gen_s"] == 3.0
    assert m["filter_groups/num_gen_batches"] == 2.0 and m["train/skipped_update"] == 0.0
    assert not [k for k in m if k.startswith("sampled/sampled/")]


def test_repaired_episodes_split_the_mean_of_the_groups_trained():
    fixed = _ep("b", "direct", 0.75, rollback=RollbackStats(rollbacks=1, retries=1))
    m, _ = _step([_rolled([*BATCH_0[:3], fixed]), _rolled(BATCH_1)])
    assert m["reward/first_try_mean"] == pytest.approx(0.5 / 3)  # b's first try, c's two
    assert m["reward/repaired_mean"] == 0.75 and m["rollback/repaired_frac"] == 0.25
    assert m["sampled/rollback/repaired_frac"] == pytest.approx(1 / 7)


def test_without_signal_or_with_every_episode_failed_the_names_count_the_first_batch():
    flat = [
        _rolled([_ep(f"a{k}", "calc", 1.0), _ep(f"a{k}", "calc", 1.0, tool_calls=3 + 2 * k)])
        for k in range(4)
    ]
    m, got = _step(flat)  # no group with signal: the first batch, as it came
    assert got.batch.uids == ["a0", "a0"] and m["episode/tool_calls/mean"] == 2.0
    assert m["sampled/episode/tool_calls/mean"] == pytest.approx(fmean([1, 3, 1, 5, 1, 7, 1, 9]))
    failed = [_rolled([_ep(f"e{k}", "calc", 0.0, env_failure="down")] * 2) for k in range(4)]
    got = fill(lambda k: failed[k], ON, 2, 0)
    assert got.batch is None and got.metrics["train/skipped_update"] == 1.0
    assert got.metrics["rollout/env_failures"] == 2.0
    assert got.metrics["sampled/rollout/env_failures"] == 8.0


def test_samples_select_and_join_keep_rows_in_step():
    a, b = _rolled(BATCH_0).samples, _rolled(BATCH_1).samples
    both = join([a, b])
    assert both.uids == list("aabbccdd") and len(both.episodes) == 8
    c = both.select({"c"})
    assert c.uids == ["c", "c"] and [e.reward for e in c.episodes] == [0.5, 0.0]
    assert c.trained == [True, True] and c.completions == []


def test_other_ranks_get_the_batch_without_its_samples_and_log_merged_metrics():
    """An FSDP2 broadcast pickles the rollout: its samples stay on rank 0, which logs."""
    r = _rolled(BATCH_0)
    copy = pickle.loads(pickle.dumps(r))
    assert copy.samples is None and r.samples is not None
    assert copy.batch.uids == r.batch.uids
    got = fill(lambda k: [copy, pickle.loads(pickle.dumps(_rolled(BATCH_1)))][k], ON, 2, 0)
    assert got.batch.uids == ["b", "b", "c", "c"]
    assert not [k for k in got.metrics if k.startswith("sampled/")]
