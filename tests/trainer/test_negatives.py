"""Negative samples in training: extra rows in their parent's GRPO group, scored
``negative_reward``, kept out of the group's baseline (mean and std of the real members) and
never given a positive advantage (issue #14 item 3)."""

from __future__ import annotations

import math
from statistics import fmean, stdev
from types import SimpleNamespace

import pytest
import torch

from tests.conftest import read_metrics
from tests.rollout.test_rollback import ANSWER, BAD, GOOD, TASK, AttemptGenerator
from toolgrpo.algos.advantages import compute_advantages, token_level_rewards
from toolgrpo.config.loader import load_config
from toolgrpo.config.schema import TrainConfig
from toolgrpo.data.task import Task
from toolgrpo.envs.registry import EnvRouter
from toolgrpo.rollout.episode import Episode
from toolgrpo.rollout.generator import SamplingParams
from toolgrpo.rollout.rollback import NegativeSample
from toolgrpo.trainer import advantage_stage
from toolgrpo.trainer.batch import minibatch_indices, negative_parents
from toolgrpo.trainer.episode_metrics import episode_metrics
from toolgrpo.trainer.episodes import EpisodeRunner
from toolgrpo.trainer.metrics import batch_metrics, negative_metrics
from toolgrpo.trainer.trainer import Trainer

KEY = "actor_rollout_ref.rollout.multi_turn."
ON = {f"{KEY}enable": "true", f"{KEY}enable_tool_rollback": "true"}


def config(**over: str) -> TrainConfig:
    return load_config(TrainConfig, None, [f"{k}={v}" for k, v in {**ON, **over}.items()])


def negative(uid: str, prefix: int, turn: list[int]) -> NegativeSample:
    ids = list(range(10, 10 + prefix)) + turn
    return NegativeSample(
        "t",
        "test",
        uid,
        [1, 2],
        ids,
        [0] * prefix + [1] * len(turn),
        [0.0] * prefix + [-0.5] * len(turn),
        ["Error: x"],
        ["exception"],
        "turn_2",
        2,
        1,
        [],
        0,
    )


def episode(uid: str, reward: float, negatives: list[NegativeSample] = ()) -> Episode:
    e = Episode("t", "test", uid, [1, 2], [5, 6, 7], [1, 0, 1], [-0.1, 0.0, -0.2])
    e.reward, e.negatives = reward, list(negatives)
    return e


def runner(cfg: TrainConfig) -> EpisodeRunner:
    return EpisodeRunner(cfg, None, SimpleNamespace(pad_token_id=0), EnvRouter())


def test_grpo_with_negatives_matches_hand_computation():
    rewards = [1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.5]  # G = 8 in group "a"
    negs = [negative("a", 3, [40, 41]), negative("a", 0, [50])]
    eps = [episode("a", r) for r in rewards]
    eps[2].negatives, eps[5].negatives = [negs[0]], [negs[1]]
    eps += [episode("b", r) for r in (1.0, 0.0)]  # a second group without negatives
    cfg = config(**{f"{KEY}negative_reward": "-2.0"})
    batch, bad = runner(cfg).to_batch(eps)
    assert bad == 0 and batch.size == 12
    assert batch.is_negative == [False] * 10 + [True] * 2 and batch.uids[10:] == ["a", "a"]
    assert negative_parents(eps) == [2, 5]
    token_rewards = token_level_rewards(batch.scores_B, batch.response_mask_BR)
    adv, _ = compute_advantages(
        "grpo",
        scores_B=token_rewards.sum(-1),
        response_mask_BT=batch.response_mask_BR,
        uids=batch.uids,
        token_rewards_BT=token_rewards,
        is_negative_B=batch.is_negative,
    )
    mean, std = fmean(rewards), stdev(rewards)  # the 8 real members only
    std_group = stdev(rewards + [-2.0, -2.0])  # the negatives' scale: the whole group
    expected = [(r - mean) / (std + 1e-6) for r in rewards] + [(-2.0 - mean) / std_group] * 2
    rows_a = [*range(8), 10, 11]
    for i, a in zip(rows_a, expected, strict=True):
        mask = batch.response_mask_BR[i].bool()
        assert torch.allclose(adv[i][mask], torch.tensor(a), atol=1e-6)
        assert bool((adv[i][~mask] == 0).all())  # the negative's prefix is not trained
    b_mean, b_std = 0.5, stdev([1.0, 0.0])
    assert adv[8][0].item() == pytest.approx((1.0 - b_mean) / (b_std + 1e-6))
    # The negative's reward sits on its last sampled token; its log-probs are the sampled ones.
    assert token_rewards[10].nonzero().flatten().tolist() == [4]
    assert batch.rollout_logprobs_BR[10, :5].tolist() == [0.0, 0.0, 0.0, -0.5, -0.5]
    # Mini-batches keep a group and its negatives together.
    assert minibatch_indices(batch.uids, 1) == [rows_a, [8, 9]]


def test_trainer_keeps_negatives_out_of_the_baseline_and_reports_them_apart():
    """Pins issue #14 item 3 in the trainer: ``advantage_stage.compute_advantages`` passes
    ``batch.is_negative`` (4 failed episodes + 1 negative gave each failure +0.447), and
    ``reward/mean`` counted the negatives' -1 as if an environment had scored them."""
    eps = [episode("a", 0.0) for _ in range(4)]
    eps[1].negatives = [negative("a", 1, [40, 41])]
    eps += [episode("b", r) for r in (1.0, 1.0, 1.0, 0.0)]
    batch, _ = runner(config()).to_batch(eps)
    assert batch.is_negative == [False] * 8 + [True]
    metrics = advantage_stage.compute_advantages(batch, config().algorithm, kl_ctrl=None)
    per_row = [float(batch.advantages_BR[i][batch.response_mask_BR[i].bool()][0]) for i in range(9)]
    assert per_row[:4] == [0.0] * 4  # all failed: no signal, and no lift from the negative
    assert per_row[8] == pytest.approx(-(5**0.5))  # -1 / std(0, 0, 0, 0, -1)
    assert per_row[4:8] == pytest.approx([0.5, 0.5, 0.5, -1.5], abs=1e-5)  # group b untouched
    assert metrics["rollout/negative_rows"] == 1.0
    assert metrics["rollout/negative_advantage_mean"] == pytest.approx(-(5**0.5))
    assert metrics["rollout/negative_zero_advantage_frac"] == 0.0
    m = batch_metrics(batch, {}, metrics, 0)
    assert m["reward/mean"] == 0.375 and m["reward/min"] == 0.0  # 8 real episodes, not -1
    assert m["reward/groups_all_equal_frac"] == 0.5 and m["batch/size"] == 9
    assert negative_metrics(runner(config()).to_batch(eps[4:])[0]) == {}


def test_startup_refuses_negative_reward_above_the_worst_real_reward():
    """Only when rollback keeps negatives, and only for environments that declare their range
    (calculator, search, BFCL: [0, 1]); single-turn and unknown-range types are not checked."""
    from toolgrpo.rollout.rollback import NegativeRewardTooHigh

    calc = Task("c", ({"role": "user", "content": "1+1"},), "2", "test", "calculator")
    rlla = Task("r", ({"role": "user", "content": "hi"},), "[]", "test", "rlla")
    div = Task("d", ({"role": "user", "content": "x"},), "2", "test", "div")
    envs = f"{KEY}envs"
    spec = "{div: {type: test_div}}"
    for value in ("-1.0", "0.0"):
        cfg = config(**{f"{KEY}negative_reward": value, envs: spec})
        EpisodeRunner(cfg, None, None, EnvRouter({"div": {"type": "test_div"}})).check(
            [calc, rlla, div]
        )
    cfg = config(**{f"{KEY}negative_reward": "0.5"})
    with pytest.raises(NegativeRewardTooHigh, match=r"negative_reward=0.5 is above the lowest "
                       r"reward \(0\) of task type 'calculator'.*<= 0"):  # fmt: skip
        runner(cfg).check([rlla, calc])
    for off in ("save_negative_samples", "enable_tool_rollback"):
        cfg = config(**{f"{KEY}negative_reward": "0.5", f"{KEY}{off}": "false"})
        runner(cfg).check([calc])
    # The div env declares no range: a negative above its rewards is only clamped (<= 0).
    cfg = config(**{f"{KEY}negative_reward": "5.0"})
    EpisodeRunner(cfg, None, None, EnvRouter({"div": {"type": "test_div"}})).check([div, rlla])


def test_negatives_are_left_out_when_not_kept():
    eps = [episode("a", 1.0, [negative("a", 0, [3])]), episode("a", 0.0)]
    for cfg in (
        load_config(TrainConfig, None, [f"{KEY}enable=true"]),
        config(**{f"{KEY}save_negative_samples": "false"}),
    ):
        batch, _ = runner(cfg).to_batch(eps)
        assert batch.size == 2 and batch.scores_B.tolist() == [1.0, 0.0]


@pytest.mark.parametrize("cap", [None, 1])
def test_runner_plays_with_rollback_and_accounts_for_every_failure(tiny_model_dir, cap):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    over = {
        f"{KEY}envs": "{div: {type: test_div, max_turns: 4}}",
        "data.max_prompt_length": "8192",
        "data.max_response_length": "600",
    }
    if cap is not None:
        over[f"{KEY}max_negative_samples_per_group"] = str(cap)
    # Every episode fails its first call; 4 of the retries fail again, then all recover.
    gen = AttemptGenerator(tok, {0: [BAD] * 20 + [GOOD], 1: [ANSWER]})
    r = EpisodeRunner(config(**over), gen, tok, EnvRouter({"div": {"type": "test_div"}}))
    tasks = [TASK, Task("t1", TASK.messages, "2", "test", "div")]
    r.check(tasks)
    eps = r.play(tasks, SamplingParams(n=8, max_new_tokens=64), step=1, policy_version=0)
    batch, _ = r.to_batch(eps)
    m = episode_metrics(eps)
    negatives = 20 if cap is None else 2  # uncapped (the default): every failed attempt
    assert batch.size == 16 + negatives and sum(batch.is_negative) == negatives
    assert batch.scores_B[16:].tolist() == [-1.0] * negatives
    assert m["rollout/negative_samples"] == negatives and m["rollout/groups_with_negatives"] == 2
    assert m["rollback/failed"] == m["rollout/negative_samples"] + m["rollback/capped"]
    assert m["rollback/erased"] == 0.0 and all(e.reward == 1.0 for e in eps)
    if cap is None:
        assert m["rollout/rollbacks"] == 16.0 and m["rollout/retries"] == 20.0
        assert m["rollout/retry_success_rate"] == 1.0 and m["rollback/capped"] == 0.0
        assert m["rollback/repaired_frac"] == 1.0 and m["reward/repaired_mean"] == 1.0
        assert "reward/first_try_mean" not in m  # no episode is a first try here
    else:  # one failure per group is a negative and retried; the 16 others stand (not erased)
        assert m["rollout/rollbacks"] == 2.0 and m["rollback/capped"] == 16.0
        assert m["rollback/repaired_frac"] == 2 / 16 and m["reward/first_try_mean"] == 1.0
    assert m["rollout/div/final_tool_error_rate"] <= m["episode/div/tool_error_rate"]
    assert not any(e.negatives for e in r.play(tasks, SamplingParams(n=2), 1, 0, rollback=False))


def test_first_try_and_repaired_rewards_are_apart():
    """reward/* used to average rollback-repaired episodes with first tries; the split says how
    much of the reward the repairs bought."""
    eps = [episode("g", r) for r in (1.0, 0.0, 1.0, 1.0)]
    eps += [Episode("x", "other", "h", [1], [5], [1], [-0.1])]
    eps[2].rollback.rollbacks = eps[3].rollback.rollbacks = 1
    eps[4].reward = 0.5
    m = episode_metrics(eps)
    assert m["rollback/repaired_frac"] == 2 / 5
    assert m["reward/first_try_mean"] == pytest.approx(0.5) and m["reward/repaired_mean"] == 1.0
    assert m["reward/test/first_try_mean"] == 0.5 and m["reward/test/repaired_mean"] == 1.0
    assert m["reward/other/first_try_mean"] == 0.5 and "reward/other/repaired_mean" not in m


def test_rollback_metrics_by_hand():
    a, b, c = episode("g1", 1.0), episode("g1", 0.0), episode("g2", 0.0)
    a.rollback.rollbacks, a.rollback.retries, a.rollback.recovered = 2, 3, 1
    b.rollback.rollbacks, b.rollback.retries, b.rollback.recovered = 1, 1, 1
    a.negatives = [negative("g1", 0, [1])] * 2
    a.tool_calls, a.tool_errors = 4, 3
    a.rollback.discarded_calls, a.rollback.discarded_errors = 3, 3
    m = episode_metrics([a, b, c])
    assert m["rollout/rollbacks"] == 3.0 and m["rollout/retries"] == 4.0
    assert m["rollout/retry_success_rate"] == pytest.approx(2 / 3)
    assert m["rollout/negative_samples"] == 2.0 and m["rollout/groups_with_negatives"] == 1.0
    assert m["rollout/test/final_tool_error_rate"] == 0.0  # the one kept call succeeded
    assert m["episode/test/tool_error_rate"] == 0.75


def test_trainer_with_rollback_on_single_turn_tasks(make_train_config, tmp_path):
    # RLLA is single-turn: nothing to roll back, but the startup check and metrics run.
    out = tmp_path / "rb"
    Trainer(make_train_config(steps=1, out=out, **ON)).fit()
    (rec,) = read_metrics(out)
    for key in (
        "rollout/rollbacks",
        "rollout/retries",
        "rollout/retry_success_rate",
        "rollout/negative_samples",
        "rollout/groups_with_negatives",
    ):
        assert rec[key] == 0.0, key
    assert math.isfinite(rec["reward/mean"]) and rec["batch/size"] == 4


def test_trainer_step_trains_on_negatives(make_train_config, tmp_path, tiny_model_dir):
    """A full step (scripted tool calls in place of the tiny model's text): negatives reach the
    update as extra rows of their groups."""
    from transformers import AutoTokenizer

    over = {
        **ON,
        f"{KEY}envs": "{div: {type: test_div, max_turns: 4}}",
        f"{KEY}max_negative_samples_per_group": "1",
        "data.max_response_length": "600",
    }
    out = tmp_path / "neg"
    trainer = Trainer(make_train_config(steps=1, out=out, **over))
    trainer.tasks = [Task(f"t{i}", TASK.messages, "2", "test", "div") for i in range(8)]
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    trainer.generator = AttemptGenerator(tok, {0: [BAD, GOOD], 1: [ANSWER]})
    seen = []
    orig = trainer.actor.update

    def update(batch):
        seen.append((list(batch.uids), list(batch.is_negative), batch.advantages_BR.clone()))
        return orig(batch)

    trainer.actor.update = update
    trainer.fit()
    (rec,) = read_metrics(out)
    ((uids, is_neg, adv),) = seen
    assert rec["rollout/negative_samples"] == sum(is_neg) >= 1 and rec["batch/size"] == len(uids)
    assert (
        rec["rollout/negative_rows"] == sum(is_neg) and rec["rollout/negative_advantage_mean"] < 0
    )
    assert rec["reward/min"] >= 0.0  # reward/* are the real episodes': no -1 from a negative
    for i in (i for i, n in enumerate(is_neg) if n):
        assert uids.count(uids[i]) == 3  # n = 2 episodes + the group's one negative
        assert adv[i].min() < 0  # scored -1 against episodes that recovered and answered
    assert math.isfinite(rec["actor/pg_loss"])


def test_mixture_rewards_by_policy_leave_negatives_out():
    """Reward-by-policy (rollout/reward_actor, _fixed) averaged the negatives' -1 into the
    policy's episodes; only real rows are samples of a policy's episodes."""
    from toolgrpo.trainer.batch import collate_rows
    from toolgrpo.trainer.rollout_stage import mixture_metrics

    rows = [([1, 2], [3], [1], [0.0])] * 3
    batch = collate_rows(rows, ["g", "g", "g"], 0)
    batch.scores_B = torch.tensor([1.0, 0.0, -1.0])
    batch.policies = ["actor", "actor", "actor"]
    batch.is_negative = [False, False, True]
    seen = {}

    def rollout_metrics(step, policies, scores):
        seen.update(policies=list(policies), scores=list(scores))
        return {}

    mixture_metrics(SimpleNamespace(rollout_metrics=rollout_metrics), 1, batch)
    assert seen == {"policies": ["actor", "actor"], "scores": [1.0, 0.0]}
