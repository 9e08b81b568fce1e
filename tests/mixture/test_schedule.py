"""Allocation schedules: α per type and its edges, seeded choices, resume, per-sample groups."""

from __future__ import annotations

import math

import pytest

from toolgrpo.config.loader import ConfigError
from toolgrpo.config.schema import RolloutAllocationScheduleConfig
from toolgrpo.mixture import (
    ACTOR,
    FIXED,
    SCHEDULES,
    RolloutAllocationSchedule,
    allocate,
    build_schedule,
    pick_fixed,
    register_schedule,
)


def Schedule(type: str = "constant", seed: int = 0, switch_steps=(), **kw):  # noqa: N802
    """A built schedule from the config's keys (``alpha_0``, ...), as the trainer builds it."""
    cfg = RolloutAllocationScheduleConfig(type=type, switch_steps=list(switch_steps), **kw)
    return build_schedule(cfg, default_seed=seed)


def test_constant_alpha_and_its_extremes():
    s = Schedule("constant", alpha=0.3)
    assert [s.actor_probability(k) for k in (1, 10, 1000)] == [0.3, 0.3, 0.3]
    assert {Schedule("constant", alpha=1.0).get_policy_choice(k) for k in range(1, 200)} == {ACTOR}
    assert {Schedule("constant", alpha=0.0).get_policy_choice(k) for k in range(1, 200)} == {FIXED}


def test_constant_coin_flip_frequency_matches_alpha():
    s = Schedule("constant", alpha=0.3, seed=7)
    share = sum(s.get_policy_choice(k) == ACTOR for k in range(1, 4001)) / 4000
    assert share == pytest.approx(0.3, abs=0.03)


def test_linear_grows_from_step_one_and_caps():
    s = Schedule("linear", alpha_0=0.2, beta=0.1, max_alpha=0.6)
    assert s.actor_probability(1) == pytest.approx(0.3)  # α0 + β·1: steps count from 1
    assert s.actor_probability(3) == pytest.approx(0.5)
    assert s.actor_probability(4) == pytest.approx(0.6)  # reaches the cap
    assert s.actor_probability(100) == pytest.approx(0.6)  # and stays there
    falling = Schedule("linear", alpha_0=0.5, beta=-0.2)
    assert falling.actor_probability(10) == 0.0  # never below 0


def test_exponential_formula_and_cap():
    s = Schedule("exponential", gamma=0.5)
    for k in (1, 2, 7):
        assert s.actor_probability(k) == pytest.approx(1 - math.exp(-0.5 * k))
    capped = Schedule("exponential", gamma=0.5, max_alpha=0.7)
    assert capped.actor_probability(1) == pytest.approx(1 - math.exp(-0.5))
    assert capped.actor_probability(50) == 0.7


def test_step_schedule_switches_at_and_after_each_switch_step():
    s = Schedule("step", switch_steps=(3, 6), initial_policy=FIXED)
    got = [s.get_policy_choice(k) for k in range(1, 9)]
    assert got == [FIXED, FIXED, ACTOR, ACTOR, ACTOR, FIXED, FIXED, FIXED]
    a = Schedule("step", switch_steps=(2,), initial_policy=ACTOR)
    assert [a.get_policy_choice(k) for k in (1, 2, 3, 99)] == [ACTOR, FIXED, FIXED, FIXED]
    assert Schedule("step", switch_steps=(1,)).get_policy_choice(1) == ACTOR  # switch at step 1


def test_choices_are_seeded_and_depend_on_the_seed():
    a, b = Schedule("constant", alpha=0.5, seed=1), Schedule("constant", alpha=0.5, seed=1)
    c = Schedule("constant", alpha=0.5, seed=2)
    run = [a.get_policy_choice(k) for k in range(1, 101)]
    assert run == [b.get_policy_choice(k) for k in range(1, 101)]
    assert run != [c.get_policy_choice(k) for k in range(1, 101)]


@pytest.mark.parametrize("kind", ["constant", "linear", "exponential"])
def test_resume_reproduces_choices(kind):
    """A schedule is a pure function of (seed, step): a fresh object built from the same config
    after a simulated resume at step k makes the same choices for k+1..N, in any query order."""
    cfg = RolloutAllocationScheduleConfig(type=kind, alpha=0.5, alpha_0=0.1, beta=0.05, gamma=0.05)
    before = build_schedule(cfg, default_seed=3)
    straight = [before.get_policy_choice(k) for k in range(1, 41)]
    groups = [before.group_choices(k, 4) for k in range(1, 41)]
    resumed = build_schedule(cfg, default_seed=3)  # a new process, resumed at k = 17
    assert [resumed.get_policy_choice(k) for k in range(40, 17, -1)] == straight[17:][::-1]
    assert [resumed.group_choices(k, 4) for k in range(18, 41)] == groups[17:]
    assert len(set(straight)) == 2  # both policies actually occur


def test_seed_none_takes_the_trainer_seed():
    cfg = RolloutAllocationScheduleConfig(seed=None)
    assert build_schedule(cfg, default_seed=11).seed == 11
    assert build_schedule(RolloutAllocationScheduleConfig(seed=5), default_seed=11).seed == 5


def test_per_sample_allocation_draws_each_group():
    s = Schedule("constant", alpha=0.5, seed=0)
    labels = allocate(s, 1, 400, [FIXED], [1.0], per_sample=True)
    assert 150 < labels.count(ACTOR) < 250 and set(labels) == {ACTOR, FIXED}
    per_step = allocate(s, 1, 8, [FIXED], [1.0], per_sample=False)
    assert len(set(per_step)) == 1 and per_step[0] == s.get_policy_choice(1)


def test_several_fixed_policies_share_by_weight():
    s = Schedule("constant", alpha=0.0, seed=0)
    labels = [lab for k in range(1, 301) for lab in allocate(s, k, 1, ["fixed", "fixed_1"], [1, 3])]
    assert labels.count("fixed_1") / len(labels) == pytest.approx(0.75, abs=0.07)
    assert pick_fixed([0.0, 1.0], 0, 5) == 1  # zero weight is never picked


@pytest.mark.parametrize(
    "kwargs, key",
    [
        ({"type": "cosine"}, "type"),
        ({"type": "constant", "alpha": 1.5}, "alpha"),
        ({"type": "linear", "alpha_0": -0.1}, "alpha_0"),
        ({"type": "linear", "max_alpha": 2.0}, "max_alpha"),
        ({"type": "linear", "beta": math.inf}, "beta"),
        ({"type": "exponential", "gamma": 0.0}, "gamma"),
        ({"type": "step", "switch_steps": ()}, "switch_steps"),
        ({"type": "step", "switch_steps": (5, 3)}, "switch_steps"),
        ({"type": "step", "switch_steps": (3, 3)}, "switch_steps"),
        ({"type": "step", "switch_steps": (0, 3)}, "switch_steps"),
        ({"type": "step", "switch_steps": (2,), "initial_policy": "critic"}, "initial_policy"),
    ],
)
def test_bad_schedules_name_the_key(kwargs, key):
    with pytest.raises(ConfigError, match=rf"rollout_allocation_schedule\.{key}"):
        Schedule(**kwargs)


def test_steps_count_from_one():
    with pytest.raises(ValueError, match="from 1"):
        Schedule().actor_probability(0)


# ---- issue #17, item 2: the schedule API ------------------------------------------------------
class EveryThird(RolloutAllocationSchedule):
    """A user schedule: the fixed policy samples every third step (``params.period``)."""

    def get_policy_choice(self, step):
        return FIXED if step % self.cfg.params.get("period", 3) == 0 else ACTOR


def test_a_user_schedule_is_one_class_and_a_name():
    register_schedule("every_third_test")(EveryThird)
    cfg = RolloutAllocationScheduleConfig(type="every_third_test", params={"period": 2})
    s = build_schedule(cfg)
    assert [s.get_policy_choice(k) for k in range(1, 5)] == [ACTOR, FIXED, ACTOR, FIXED]
    assert allocate(s, 2, 3, [FIXED], [1.0], per_sample=True) == [FIXED] * 3  # default groups
    assert s.actor_probability(2) is None


def test_a_user_schedule_by_import_path():
    cfg = RolloutAllocationScheduleConfig(type="tests.mixture.test_schedule:EveryThird")
    assert build_schedule(cfg).get_policy_choice(3) == FIXED
    with pytest.raises(ConfigError, match="cannot be imported"):
        build_schedule(RolloutAllocationScheduleConfig(type="tests.nowhere:Nope"))
    with pytest.raises(ConfigError, match="not a RolloutAllocationSchedule"):
        build_schedule(RolloutAllocationScheduleConfig(type="math:floor"))


def test_every_built_in_schedule_implements_the_abstract_api():
    assert {"constant", "linear", "exponential", "step", "adaptive"} <= set(SCHEDULES)
    for cls in SCHEDULES.values():
        assert issubclass(cls, RolloutAllocationSchedule)
    with pytest.raises(TypeError):
        RolloutAllocationSchedule(RolloutAllocationScheduleConfig())  # abstract


def test_a_schedule_returning_nonsense_is_caught():
    class Bad(RolloutAllocationSchedule):
        def get_policy_choice(self, step):
            return "critic"

    with pytest.raises(ValueError, match="critic"):
        allocate(Bad(RolloutAllocationScheduleConfig()), 1, 2, [FIXED], [1.0])


def _adaptive(**kw):
    return Schedule("adaptive", **{"alpha": 0.2, "max_alpha": 0.9, "ema": 0.5, **kw})


def test_adaptive_ess_signal_raises_alpha_as_ess_falls():
    s = _adaptive()
    assert s.actor_probability(1) == pytest.approx(0.2)  # nothing observed
    s.observe({"rollout/fixed_seq_ess": 1.0})
    assert s.actor_probability(2) == pytest.approx(0.2)  # as good as on-policy: keep α
    s.observe({"rollout/fixed_seq_ess": 0.0})  # running mean 0.5
    assert s.actor_probability(3) == pytest.approx(0.2 + 0.7 * 0.5)
    s.observe({"rollout/reward_actor": 5.0, "rollout/reward_fixed": 1.0})  # ignored: ess signal
    assert s.actor_probability(4) == pytest.approx(0.55)
    s.observe({"rollout/fixed_seq_ess": float("nan")})  # no fixed rows with tokens: ignored
    assert s.actor_probability(5) == pytest.approx(0.55)


def test_adaptive_reward_signal_switches_once_the_actor_catches_up():
    s = _adaptive(signal="reward", ema=1.0)
    s.observe({"rollout/reward_fixed": 1.0})
    assert s.actor_probability(1) == pytest.approx(0.2)  # no actor reward yet
    s.observe({"rollout/reward_actor": 0.5})
    assert s.actor_probability(2) == pytest.approx(0.2)
    s.observe({"rollout/reward_actor": 1.0})
    assert s.actor_probability(3) == pytest.approx(0.9)


@pytest.mark.parametrize(
    "kw, key",
    [({"alpha": 0.95}, "alpha"), ({"signal": "loss"}, "signal"), ({"ema": 0.0}, "ema")],
)
def test_bad_adaptive_settings_name_the_key(kw, key):
    with pytest.raises(ConfigError, match=rf"rollout_allocation_schedule\.{key}"):
        _adaptive(**kw)
