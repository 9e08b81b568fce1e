"""What becomes of each failed tool attempt: a negative (then retried, or gone on from with its
error feedback in ``relabel``), left standing (retries spent, or the group's cap), or erased (only
with negatives off, and counted). No mode drops a failure silently. Fission's forks are tested in
``test_fission.py``."""

from __future__ import annotations

import pytest

from tests.rollout.test_rollback import (
    ANSWER,
    BAD,
    GOOD,
    TASK,
    PlainEnv,
    ScriptedEnv,
    div_env,
    ones,
    play,
)
from tests.trainer.test_negatives import config
from toolgrpo.config.loader import ConfigError, load_config
from toolgrpo.config.schema import TrainConfig
from toolgrpo.config.validate import validate_train_config
from toolgrpo.data.task import Task
from toolgrpo.envs.registry import EnvRouter
from toolgrpo.rollout.fission import make_recorder
from toolgrpo.rollout.rollback import (
    NegativeBudget,
    RollbackPolicy,
    SnapshotUnsupported,
    failure_fate,
    make_guard,
)
from toolgrpo.tools.types import ToolResult
from toolgrpo.trainer.episodes import EpisodeRunner

KEY = "actor_rollout_ref.rollout.multi_turn."
RELABEL = RollbackPolicy(mode="relabel")


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def test_failure_fate_accounts_for_every_attempt():
    p = RollbackPolicy(max_retries=2, max_negatives_per_group=1)
    budget = NegativeBudget(1)
    assert failure_fate(p, 0, budget) == "negative"
    assert failure_fate(p, 1, budget) == "capped"  # the cap bounds rows; the failure stands
    assert failure_fate(p, 2, NegativeBudget(5)) == "stands"  # retries spent
    assert budget.used == 1
    off = RollbackPolicy(save_negatives=False)
    assert failure_fate(off, 0, NegativeBudget(0)) == "erased"  # design 004's hole, opt-in
    uncapped = RollbackPolicy()
    assert uncapped.max_negatives_per_group is None and uncapped.keeps_negatives
    assert all(failure_fate(uncapped, 0, NegativeBudget(None)) == "negative" for _ in range(50))
    assert not RollbackPolicy(max_negatives_per_group=0).keeps_negatives


def test_negatives_off_erases_and_counts_it(tok):
    ep, _ = play(
        tok, {0: [BAD, GOOD], 1: [ANSWER]}, div_env(), RollbackPolicy(save_negatives=False)
    )
    r = ep.rollback
    assert not ep.negatives and (r.failed, r.erased, r.retries, r.recovered) == (1, 1, 1, 1)
    assert r.repaired and ep.reward == 1.0


# ---- relabel -----------------------------------------------------------------------------------


def test_relabel_keeps_the_failure_and_goes_on_from_its_error_feedback(tok):
    ep, gen = play(tok, {0: [BAD], 1: [GOOD], 2: [ANSWER]}, div_env(), RELABEL)
    assert ep.reward == 1.0 and ep.num_turns == 3 and len(gen.sampled) == 3
    r = ep.rollback
    assert (r.failed, r.forks, r.rollbacks, r.retries, r.recovered) == (1, 1, 1, 1, 1)
    assert (r.discarded_calls, r.discarded_errors) == (0, 0)  # nothing left the transcript
    text = tok.decode(ep.response_ids, skip_special_tokens=False)
    assert "ZeroDivisionError" in text and '"b": 0' in text  # the error is the next turn's context
    # The failing turn is not trained in the episode (its reward must not reinforce it) ...
    bad, good, answer = gen.sampled
    assert ones(ep.response_ids, ep.response_mask) == [good[0], answer[0]]
    assert ones(ep.logprobs, ep.response_mask) == [good[1], answer[1]]
    # ... but in its negative: prefix (here none) + the failing turn, as in retry mode.
    (neg,) = ep.negatives
    assert neg.response_ids == bad[0] and neg.response_mask == [1] * len(bad[0])
    assert neg.logprobs == bad[1] and neg.error_types == ["exception"] and neg.attempt == 0
    assert [m["role"] for m in ep.messages][-5:] == [
        "assistant",
        "tool",
        "assistant",
        "tool",
        "assistant",
    ]


def test_relabel_max_retries_times_in_a_row_then_the_failure_stands(tok):
    script = {0: [BAD], 1: [BAD], 2: [BAD], 3: [ANSWER]}
    ep, gen = play(tok, script, div_env(max_turns=5), RELABEL)
    r = ep.rollback
    assert (r.failed, r.forks, r.rollbacks, r.recovered) == (3, 2, 1, 0)
    assert [n.attempt for n in ep.negatives] == [0, 1]
    trained = ones(ep.response_ids, ep.response_mask)
    assert trained == [gen.sampled[2][0], gen.sampled[3][0]]  # the standing failure, the answer


def test_relabel_on_the_last_turn_leaves_the_failure_standing(tok):
    ep, gen = play(tok, {0: [GOOD], 1: [BAD]}, div_env(max_turns=2), RELABEL)
    assert ep.stop_reason == "max_turns" and not ep.negatives
    assert (ep.rollback.failed, ep.rollback.forks) == (1, 0)
    assert ones(ep.response_ids, ep.response_mask)[-1] == gen.sampled[-1][0]


def test_relabel_needs_no_snapshots(tok):
    """Nothing is restored in relabel, so environments that cannot copy their state (MCP,
    OpenEnv, remote sessions) may use it; retry refuses them, and so does fission (its forks
    restore a state into a new environment)."""
    env = PlainEnv()
    assert make_guard(env, "plain", RELABEL, None) is not None
    with pytest.raises(SnapshotUnsupported):
        make_guard(env, "plain", RollbackPolicy(), None)
    with pytest.raises(SnapshotUnsupported, match="rollback_mode=fission"):
        make_recorder(env, TASK, RollbackPolicy(mode="fission"), None)

    class NoSnapshot(ScriptedEnv):
        supports_snapshot = False

        def snapshot(self):
            raise AssertionError("relabel must not snapshot")

    boom = [ToolResult("boom", True, "exception", "div")]
    ok = [ToolResult("2.0", name="div")]
    ep, _ = play(tok, {0: [BAD], 1: [GOOD], 2: [ANSWER]}, NoSnapshot([boom, ok]), RELABEL)
    assert ep.rollback.forks == 1 and ep.rollback.recovered == 1 and len(ep.negatives) == 1


def test_relabel_cap_past_which_failures_stand(tok):
    policy = RollbackPolicy(mode="relabel", max_negatives_per_group=1)
    script = {0: [BAD], 1: [BAD], 2: [ANSWER]}
    ep, gen = play(tok, script, div_env(), policy, NegativeBudget(1))
    r = ep.rollback
    assert (r.failed, r.forks, r.capped, len(ep.negatives)) == (2, 1, 1, 1)
    assert ones(ep.response_ids, ep.response_mask)[0] == gen.sampled[1][0]  # stands, trained


# ---- config ------------------------------------------------------------------------------------


def _cfg(*over: str) -> TrainConfig:
    base = [f"{KEY}enable=true", f"{KEY}enable_tool_rollback=true"]
    return load_config(TrainConfig, None, base + [f"{KEY}{o}" for o in over])


def test_config_keys_and_defaults():
    mt = TrainConfig().actor_rollout_ref.rollout.multi_turn
    assert mt.rollback_mode == "retry" and mt.max_negative_samples_per_group is None
    assert mt.save_negative_samples and mt.max_tool_retries == 2
    assert mt.fission_group_size == 4 and mt.max_fission_forks_per_step == 8
    c = _cfg("rollback_mode=relabel", "max_negative_samples_per_group=3")
    validate_train_config(c)
    p = RollbackPolicy.from_config(c.actor_rollout_ref.rollout.multi_turn)
    assert p.mode == "relabel" and p.max_negatives_per_group == 3
    c = _cfg("max_negative_samples_per_group=null")
    validate_train_config(c)
    assert RollbackPolicy.from_config(c.actor_rollout_ref.rollout.multi_turn).keeps_negatives


@pytest.mark.parametrize(
    ("over", "message"),
    [
        (["rollback_mode=fision"], "rollback_mode='fision' is not one of retry, fission, relabel"),
        (
            ["rollback_mode=relabel", "save_negative_samples=false"],
            "relabel trains each relabelled failure only as a negative",
        ),
        (["rollback_mode=fission", "fission_group_size=1"], "fission_group_size must be >= 2"),
    ],
)
def test_bad_rollback_settings_are_refused(over, message):
    with pytest.raises(ConfigError, match=message):
        validate_train_config(_cfg(*over))
    with pytest.raises(ValueError):
        RollbackPolicy(mode="relabel", save_negatives=False)
    with pytest.raises(ValueError):
        RollbackPolicy(mode="fission", fission_group_size=1)


def test_startup_checks_follow_the_mode(caplog):
    """relabel takes no snapshot, so an environment that cannot snapshot passes; retry and
    fission refuse it. Negatives off is allowed, with a warning that names what it hides."""
    plain = Task("p", TASK.messages, "", "test", "plain")
    router = EnvRouter({"plain": {"type": "test_plain"}})
    EpisodeRunner(config(**{f"{KEY}rollback_mode": "relabel"}), None, None, router).check([plain])
    with pytest.raises(SnapshotUnsupported):
        EpisodeRunner(config(), None, None, router).check([plain])
    with pytest.raises(SnapshotUnsupported, match="rollback_mode=fission"):
        fission = config(**{f"{KEY}rollback_mode": "fission"})
        EpisodeRunner(fission, None, None, router).check([plain])
    off = config(**{f"{KEY}save_negative_samples": "false"})
    with caplog.at_level("WARNING"):
        EpisodeRunner(off, None, None, EnvRouter({"div": {"type": "test_div"}})).check([TASK])
    assert "erases every retried failure" in caplog.text


# ---- design 004's YAML, verbatim ---------------------------------------------------------------

DESIGN_004 = [
    """
actor_rollout_ref:
  rollout:
    multi_turn:
      enable_tool_rollback: true
      max_tool_retries: 3
      save_negative_samples: true  # Enable negative sample saving
      max_negative_samples_per_group: 1  # Max negative samples per group
""",
    """
algorithm:
  adv_estimator: grpo

actor_rollout_ref:
  rollout:
    n: 8  # Generate 8 samples per prompt
    multi_turn:
      enable_tool_rollback: true
      max_tool_retries: 3
      save_negative_samples: true
      max_negative_samples_per_group: 1  # Add at most 1 negative sample per group
""",
]


@pytest.mark.parametrize("text", DESIGN_004)
def test_design_004s_yaml_still_runs_verbatim(tok, tmp_path, text):
    """The design's configuration blocks load, validate and play: retry, a cap of one negative
    per group, the failure rolled back into it (multi_turn.enable on, as every multi-turn run)."""
    path = tmp_path / "design_004.yaml"
    path.write_text(text)
    cfg = load_config(TrainConfig, str(path), [f"{KEY}enable=true"])
    validate_train_config(cfg)
    policy = RollbackPolicy.from_config(cfg.actor_rollout_ref.rollout.multi_turn)
    assert policy is not None and policy.mode == "retry" and policy.max_retries == 3
    assert policy.max_negatives_per_group == 1 and policy.keeps_negatives
    ep, _ = play(tok, {0: [BAD, GOOD], 1: [ANSWER]}, div_env(), policy, NegativeBudget(1))
    assert ep.reward == 1.0 and len(ep.negatives) == 1 and ep.rollback.recovered == 1
