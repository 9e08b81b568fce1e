"""The served head's budget offset (router/offset.py): the fit, and the head that serves it."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from toolgrpo.router.offset import (
    BOUND,
    OFFSET_KEY,
    AnswerOffset,
    expected_cost,
    fit_answer_offset,
    shifted,
)
from toolgrpo.router.policy import RouterPolicy

ROUTES = ["ANSWER", "SEARCH", "CALCULATE"]


def _row(p_answer, p_search, tool_cost=1.0, answer_cost=0.0, name="t"):
    return {
        "task_id": name,
        "probs": {"ANSWER": p_answer, "SEARCH": p_search, "CALCULATE": 1 - p_answer - p_search},
        "cost": {"ANSWER": answer_cost, "SEARCH": tool_cost, "CALCULATE": tool_cost},
    }


def test_the_shift_moves_answer_against_the_tool_routes_alike():
    p = shifted([0.5, 0.3, 0.2], ROUTES, math.log(3.0))  # ANSWER's odds × 3
    assert p[0] == pytest.approx(1.5 / 2.0)
    assert p[1] / p[2] == pytest.approx(0.3 / 0.2)  # the tool routes keep their ratio
    assert shifted([0.5, 0.3, 0.2], ROUTES, 0.0) == pytest.approx([0.5, 0.3, 0.2])


def test_a_binding_budget_is_spent_exactly_from_either_side():
    rows = [_row(0.8, 0.1, name="a"), _row(0.7, 0.1, name="b")]  # spends 0.25
    assert expected_cost(rows, ROUTES, 0.0) == pytest.approx(0.25)
    up = fit_answer_offset(rows, ROUTES, 0.3, binding=True, step=60)
    assert up.delta < 0 and up.spend == pytest.approx(0.3) and up.feasible
    assert (up.spend_before, up.tasks, up.step) == (pytest.approx(0.25), 2, 60)
    down = fit_answer_offset(rows, ROUTES, 0.2, binding=True)
    assert down.delta > 0 and down.spend == pytest.approx(0.2)


def test_a_slack_budget_only_caps_the_cost():
    rows = [_row(0.8, 0.1), _row(0.7, 0.1)]  # 0.25
    under = fit_answer_offset(rows, ROUTES, 0.3, binding=False)
    assert under.delta == 0.0 and under.spend == pytest.approx(0.25)  # its own choice stands
    over = fit_answer_offset(rows, ROUTES, 0.2, binding=False)
    assert over.delta > 0 and over.spend == pytest.approx(0.2)


def test_an_unreachable_budget_is_flagged_at_the_bound():
    rows = [_row(0.5, 0.2, answer_cost=0.5)]  # ANSWER alone costs more than B
    fit = fit_answer_offset(rows, ROUTES, 0.3, binding=True)
    assert not fit.feasible and fit.delta == BOUND
    cheap = [_row(0.5, 0.2, tool_cost=0.2)]  # every route together spends under B
    fit = fit_answer_offset(cheap, ROUTES, 0.3, binding=True)
    assert not fit.feasible and fit.delta == -BOUND


def test_the_fit_refuses_what_it_cannot_read():
    with pytest.raises(ValueError, match="ANSWER"):
        fit_answer_offset([_row(0.5, 0.2)], ["SEARCH", "CALCULATE"], 0.3, True)
    partial = _row(0.5, 0.2)
    del partial["cost"]["SEARCH"]
    with pytest.raises(ValueError, match="every route's cost"):
        fit_answer_offset([partial], ROUTES, 0.3, True)
    with pytest.raises(ValueError, match="at least one task"):
        fit_answer_offset([], ROUTES, 0.3, True)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(0.01, 0.98), st.floats(0.0, 1.0), st.floats(0.0, 1.0), st.floats(0.0, 1.0)
        ),
        min_size=1,
        max_size=12,
    ),
    st.floats(0.05, 0.95),
)
def test_the_fit_lands_on_the_budget_whenever_the_bound_allows(raw, budget):
    rows = []
    for i, (pa, split, c_s, c_c) in enumerate(raw):
        ps = (1 - pa) * split
        rows.append(
            {
                "task_id": str(i),
                "probs": {"ANSWER": pa, "SEARCH": ps, "CALCULATE": 1 - pa - ps},
                "cost": {"ANSWER": 0.0, "SEARCH": c_s, "CALCULATE": c_c},
            }
        )
    fit = fit_answer_offset(rows, ROUTES, budget, binding=True)
    reachable = expected_cost(rows, ROUTES, BOUND) <= budget <= expected_cost(rows, ROUTES, -BOUND)
    assert fit.feasible == reachable
    if reachable:
        assert fit.spend == pytest.approx(budget, abs=1e-9)
    assert AnswerOffset.from_state(fit.to_state()) == fit


def _policy():
    lm = SimpleNamespace(base=SimpleNamespace(config=SimpleNamespace(hidden_size=4)))
    return RouterPolicy(lm, ROUTES, head_ema=0.5)


def test_the_served_head_carries_the_offset_and_training_does_not():
    router = _policy()
    feats = torch.randn(6, 4)
    router.observe(feats)
    router.update(feats, torch.tensor([0, 1, 2] * 2), torch.randn(6), entropy_coeff=0.0)
    with router.averaged():
        plain = router.act(feats, sample=False).probs
    router.offset = AnswerOffset(1.5, 0.3, 0.25, 0.3, 6, True, True, 1)
    with router.averaged():
        served = router.act(feats, sample=False).probs
    want = torch.tensor([shifted(p.tolist(), ROUTES, 1.5) for p in plain])
    torch.testing.assert_close(served, want)
    raw = router.head(feats)  # outside the block: the last iterate, no shift
    assert router.head.logit_shift is None
    torch.testing.assert_close(raw, router.head.net(router.head.normalize(feats)))
    # router.pt keeps it; a resume restores it unapplied, a served head applies it
    state = router.state_dict()
    assert AnswerOffset.from_state(state[OFFSET_KEY]) == router.offset
    resumed = _policy()
    resumed.load_state_dict(state)
    assert resumed.offset == router.offset and resumed.head.logit_shift is None
    loaded = RouterPolicy(router.lm, ROUTES)
    loaded.load_state_dict(state)
    loaded.adopt_average(state)
    torch.testing.assert_close(loaded.act(feats, sample=False).probs, served)
    # a router.pt from before the offset serves the averaged head alone
    state.pop(OFFSET_KEY)
    old = RouterPolicy(router.lm, ROUTES)
    old.load_state_dict(state)
    old.adopt_average(state)
    assert old.offset is None
    torch.testing.assert_close(old.act(feats, sample=False).probs, plain)
