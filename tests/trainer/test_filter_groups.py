"""Dynamic sampling (``algorithm.filter_groups``): which groups carry signal, joining batches of
different widths, the sampling loop's stopping rules, and a tiny-model run that trains only on
groups whose scores differ and dumps every batch it sampled."""

from __future__ import annotations

import json
import zlib
from statistics import fmean

import pytest
import torch

from tests.conftest import read_metrics, rlla_row, write_jsonl
from toolgrpo.config.algorithm import FilterGroupsConfig
from toolgrpo.config.loader import ConfigError
from toolgrpo.config.validate import validate_train_config
from toolgrpo.envs import rlla as rlla_env
from toolgrpo.report.plots import PANELS, panel_keys
from toolgrpo.rewards.scoring import Score
from toolgrpo.trainer import rollout_stage
from toolgrpo.trainer.batch import collate_rows
from toolgrpo.trainer.filter_groups import concat, fill, informative
from toolgrpo.trainer.rollout_stage import Rolled
from toolgrpo.trainer.trainer import Trainer


def _rows(n: int, p: int, r: int, start: int = 0) -> list:
    """n rows with p prompt tokens each and r or r - 1 response tokens."""
    out = []
    for i in range(n):
        k = r - i % 2
        out.append((list(range(start + i, start + i + p)), [7] * k, [1] * k, [-0.5] * k))
    return out


def _batch(uids: list[str], scores: list[float], p: int = 3, r: int = 4):
    b = collate_rows(_rows(len(uids), p, r), uids, pad_id=0)
    b.scores_B = torch.tensor(scores)
    b.task_types = ["calculator"] * len(uids)
    return b


def test_a_group_carries_signal_when_its_scores_differ_negatives_included():
    b = _batch(["a", "a", "b", "b", "c", "c", "a"], [1, 1, 0, 1, 0, 0, 0.0])
    b.is_negative = [False] * 6 + [True]  # a's rolled-back failure scored 0: a has signal now
    groups, total = informative(b)
    assert total == 3 and groups == [[0, 1, 6], [2, 3]]
    b.scores_B[6] = 2.0  # a negative above its group gets advantage 0: no signal then
    assert informative(b)[0] == [[2, 3]]
    b = _batch(["a", "b", "b"], [1.0, 0.0, 0.0])  # a singleton (its sibling's env failed): as verl
    assert informative(b)[0] == []


def test_concat_of_batches_of_different_widths_is_the_batch_of_all_rows():
    a, b = _rows(3, 2, 5), _rows(2, 6, 3, start=50)
    whole = collate_rows(a + b, list("xxxyy"), pad_id=0)
    parts = [collate_rows(a, list("xxx"), 0), collate_rows(b, list("yy"), 0)]
    for p, s in zip(parts, ([1.0, 0, 1], [0.5, 0.25]), strict=True):
        p.scores_B = torch.tensor(s)
        p.task_types = ["t"] * p.size
    got = concat(parts, pad_id=0)
    for name in ("input_ids_BT", "attention_mask_BT", "response_mask_BR", "rollout_logprobs_BR"):
        assert torch.equal(getattr(got, name), getattr(whole, name)), name
    assert got.scores_B.tolist() == [1.0, 0, 1, 0.5, 0.25]
    assert got.uids == list("xxxyy") and got.task_types == ["t"] * 5
    parts[1].task_types = []
    with pytest.raises(ValueError, match="task_types"):
        concat(parts, pad_id=0)


class _Sampler:
    """Hand-made rollouts by batch number: (uids, scores) each, None for a failed batch."""

    def __init__(self, plan):
        self.plan, self.calls = plan, []

    def __call__(self, k: int) -> Rolled:
        self.calls.append(k)
        spec = self.plan[min(k, len(self.plan) - 1)]
        batch = _batch(*spec) if spec is not None else None
        return Rolled(batch, {"episode/reward/mean": float(k)}, {"timing/gen_s": 2.0}, 1.0)


ON = FilterGroupsConfig(enable=True, max_num_gen_batches=4)
FLAT = (["a", "a", "b", "b"], [1.0, 1.0, 0.0, 0.0])


def test_off_the_first_batch_is_trained_as_it_came():
    s = _Sampler([FLAT])
    got = fill(s, FilterGroupsConfig(), 2, 0)
    assert s.calls == [0] and got.batch.size == 4 and "filter_groups/kept_groups" not in got.metrics


def test_it_samples_until_enough_groups_carry_signal_and_trims_the_rest():
    s = _Sampler(
        [
            (["a", "a", "b", "b"], [1.0, 0.0, 0.0, 0.0]),  # a has signal
            None,  # every episode of batch 1 failed in its environment
            (["c", "c", "d", "d"], [1.0, 0.0, 0.5, 0.0]),  # both: d is one too many
        ]
    )
    got = fill(s, ON, 2, 0)
    assert s.calls == [0, 1, 2]
    assert got.batch.uids == ["a", "a", "c", "c"]
    assert got.batch.scores_B.tolist() == [1.0, 0.0, 1.0, 0.0]
    m = got.metrics
    assert m["filter_groups/num_gen_batches"] == 3 and m["filter_groups/kept_groups"] == 2
    assert m["filter_groups/informative_frac"] == 3 / 4  # of the groups sampled
    assert m["episode/reward/mean"] == 1.0  # rollout metrics: the mean over the batches
    assert got.timing["timing/gen_s"] == 6.0 and got.nonfinite == 3.0
    assert m["train/skipped_update"] == 0.0


def test_at_the_cap_it_trains_on_what_it_has_or_on_the_first_batch():
    s = _Sampler([(["a", "a", "b", "b"], [1.0, 0.0, 0.0, 0.0]), FLAT])
    got = fill(s, ON, 2, 0)
    assert s.calls == [0, 1, 2, 3] and got.batch.uids == ["a", "a"]
    s = _Sampler([FLAT])
    got = fill(s, ON, 2, 0)  # no signal anywhere: the first batch, as without the filter
    assert (
        len(s.calls) == 4 and got.batch.size == 4 and got.metrics["filter_groups/kept_groups"] == 0
    )
    s = _Sampler([None])
    got = fill(s, ON, 2, 0)
    assert got.batch is None and got.metrics["train/skipped_update"] == 1.0


def test_no_cap_samples_as_long_as_it_takes():
    s = _Sampler([FLAT] * 6 + [(["c", "c", "d", "d"], [1.0, 0.0, 0.5, 0.0])])
    got = fill(s, FilterGroupsConfig(enable=True, max_num_gen_batches=0), 2, 0)
    assert len(s.calls) == 7 and got.batch.uids == ["c", "c", "d", "d"]


@pytest.mark.parametrize(
    "extra, key",
    [
        ({"algorithm.adv_estimator": "gae"}, "grpo"),
        ({"async_training.enable": "true"}, "async_training"),
        ({"algorithm.filter_groups.metric": "acc"}, "metric"),
    ],
)
def test_settings_it_cannot_honour_are_refused(make_train_config, extra, key):
    with pytest.raises(ConfigError, match=key):
        validate_train_config(
            make_train_config(**{"algorithm.filter_groups.enable": "true", **extra})
        )


def _half_flat(task, text, step, flags):
    """Tasks with an even index score 1 on every sample (no signal); the others vary."""
    if int(task.task_id.rsplit("#", 1)[-1]) % 2 == 0:
        return Score(1.0, 0.0, 1.0, 0.0, False, False)
    v = float(zlib.crc32(text.encode()) % 7) - 3.0
    return Score(v, 0.0, v, 0.0, False, False)


def _run(make_train_config, out, steps: int, cap: int, **extra) -> tuple[list, list[dict]]:
    """A tiny run with dynamic sampling and dumps: the batches it trained and its metrics."""
    cfg = make_train_config(
        steps=steps,
        out=out,
        **{
            "algorithm.filter_groups.enable": "true",
            "algorithm.filter_groups.max_num_gen_batches": cap,
            "trainer.rollout_data_dir": str(out / "dumps"),
            "trainer.save_freq": -1,
            **extra,
        },
    )
    t = Trainer(cfg)
    trained = []
    orig = t.actor.update
    t.actor.update = lambda b: (trained.append(b), orig(b))[1]
    t.fit()
    return trained, read_metrics(out)


def test_a_run_trains_only_on_groups_with_signal_and_dumps_every_batch(
    make_train_config, tmp_path, monkeypatch
):
    monkeypatch.setattr(rollout_stage, "score", _half_flat)
    out = tmp_path / "dyn"
    trained, recs = _run(make_train_config, out, 2, 0)
    for b in trained:
        groups, total = informative(b)
        assert total == 2 and len(groups) == 2  # train_batch_size groups, each with signal
    for r in recs:
        assert r["filter_groups/kept_groups"] == 2
        assert r["reward/groups_all_equal_frac"] == 0.0
        dumped = (out / "dumps" / f"{r['step']}.jsonl").read_text().splitlines()
        n_batches = int(r["filter_groups/num_gen_batches"])
        assert len(dumped) == 4 * n_batches  # 2 tasks x n=2 per batch, every batch kept
        assert {json.loads(x)["step"] for x in dumped} == {r["step"]}
        # plain names: the groups trained; sampled/: every batch the step sampled (and dumped)
        rewards = [json.loads(x)["reward"] for x in dumped]
        assert r["sampled/reward/mean"] == pytest.approx(fmean(rewards))
        assert r["sampled/reward/groups_all_equal_frac"] > 0 or n_batches == 1
    for r, b in zip(recs, trained, strict=True):
        assert r["reward/mean"] == pytest.approx(b.scores_B.mean().item())
    assert max(r["filter_groups/num_gen_batches"] for r in recs) > 1


def test_multi_turn_episodes_are_filtered_and_dumped_batch_after_batch(make_train_config, tmp_path):
    out = tmp_path / "mt"
    mt = {"actor_rollout_ref.rollout.multi_turn.enable": "true"}
    trained, (r,) = _run(make_train_config, out, 1, 3, **mt)
    n = int(r["filter_groups/num_gen_batches"])
    kept = int(r["filter_groups/kept_groups"])
    assert 1 <= n <= 3 and (kept == 2 or n == 3)  # stopped with enough groups, or at the cap
    dumped = [json.loads(x) for x in (out / "dumps" / "1.jsonl").read_text().splitlines()]
    assert len(dumped) == 4 * n and len({d["uid"] for d in dumped}) == 2 * n
    (b,) = trained
    assert len(informative(b)[0]) == kept and r["episode/rlla/turns/mean"] == 1.0


def test_first_try_mean_is_the_mean_when_nothing_was_repaired(
    make_train_config, tmp_path, monkeypatch
):
    """Rollback off, dynamic sampling on, two task types: the plain names count the groups
    trained, ``sampled/`` every episode dumped. Before, ``reward/<type>/first_try_mean`` was
    averaged over every batch sampled while ``reward/<type>/mean`` counted the batch trained."""
    monkeypatch.setattr(rlla_env, "score", _half_flat)
    rows = [rlla_row(i) for i in range(8)]
    for i, row in enumerate(rows):  # 0, 1: rlla; 2, 3: other; ... (even tasks flat in both)
        row["extra_info"]["task_type"] = "rlla" if i % 4 < 2 else "other"
    data = write_jsonl(tmp_path / "two_types.jsonl", rows)
    mt = {
        "actor_rollout_ref.rollout.multi_turn.enable": "true",
        "actor_rollout_ref.rollout.multi_turn.envs": "{other: {type: rlla}}",
    }
    out = tmp_path / "ft"
    trained, recs = _run(make_train_config, out, 3, 4, data=data, **mt)
    for r, b in zip(recs, trained, strict=True):
        assert "reward/repaired_mean" not in r and r["rollback/repaired_frac"] == 0.0
        for pre in ("", "sampled/"):
            assert r[f"{pre}reward/first_try_mean"] == pytest.approx(r[f"{pre}reward/mean"])
            assert r[f"{pre}episode/reward/mean"] == pytest.approx(r[f"{pre}reward/mean"])
            for t in ("rlla", "other"):
                if f"{pre}reward/{t}/mean" in r:
                    got = r[f"{pre}reward/{t}/first_try_mean"]
                    assert got == pytest.approx(r[f"{pre}reward/{t}/mean"])
        assert r["reward/mean"] == pytest.approx(b.scores_B.mean().item())
        dumped = [json.loads(x) for x in (out / "dumps" / f"{r['step']}.jsonl").open()]
        assert r["sampled/episode/reward/mean"] == pytest.approx(fmean(d["reward"] for d in dumped))
        for t in ("rlla", "other"):
            if f"sampled/reward/{t}/mean" in r:
                mine = [d["reward"] for d in dumped if d["task_type"] == t]
                assert r[f"sampled/reward/{t}/mean"] == pytest.approx(fmean(mine))
    assert any("reward/other/first_try_mean" in r for r in recs)  # both types trained in a step
    panels, logged = {t: spec for t, spec, _ in PANELS}, set().union(*recs)  # the report finds them
    assert {"reward/mean", "sampled/reward/mean"} <= set(panel_keys(panels["Reward"], logged))
    assert len(panel_keys(panels["Groups with signal"], logged)) == 2
