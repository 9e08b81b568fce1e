"""τ from validation to ``toolgrpo infer``: validation calibrates the threshold on P(tool), the
checkpoint's router.pt stores it, a resume restores it, ``toolgrpo infer`` routes by it by
default (router.infer_mode=auto with a binding budget), and a router.pt without one (an older
checkpoint) still loads, falling back to the argmax with a warning. Validation also fits the
served head's budget offset on training tasks, and ``toolgrpo eval --fit-offset`` fits one for a
checkpoint saved without it."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math

import pytest
import torch
from rich.console import Console

from tests.conftest import env_task_file, train_overrides
from toolgrpo.config.loader import ConfigError, load_config
from toolgrpo.config.schema import TrainConfig
from toolgrpo.eval.cli import run_eval
from toolgrpo.infer import run_infer
from toolgrpo.models.safe_load import load_torch_file
from toolgrpo.router.calibrate import THRESHOLD_KEY, Threshold
from toolgrpo.router.offset import OFFSET_KEY, AnswerOffset
from toolgrpo.trainer.trainer import Trainer

LIMITS = [
    "data.max_response_length=12",
    "actor_rollout_ref.rollout.multi_turn.max_tokens_per_turn=6",
]


@pytest.fixture(scope="module")
def run(tiny_model_dir, tmp_path_factory):
    """One router-only step on calculator/search/direct tasks, validated at step 1."""
    tmp = tmp_path_factory.mktemp("thr")
    data = env_task_file(tmp / "env.jsonl", 2)
    ov = train_overrides(
        tiny_model_dir,
        data,
        tmp / "run",
        1,
        **{
            "data.max_response_length": 24,
            "actor_rollout_ref.rollout.multi_turn.enable": "true",
            "actor_rollout_ref.rollout.multi_turn.max_tokens_per_turn": 8,
            "actor_rollout_ref.rollout.generation_batch_size": 4,
            "router.enable": "true",
            "router.freeze_lm": "true",
            "trainer.test_freq": 1,
            "trainer.logger": "[console,jsonl]",
        },
    )
    err = io.StringIO()  # the console's phase lines (not a terminal: one line per phase)
    with contextlib.redirect_stderr(err):
        trainer = Trainer(load_config(TrainConfig, None, ov))
        try:
            history = trainer.fit()
        finally:
            trainer.close()
    return ov, tmp / "run" / "checkpoints" / "global_step_1", history, err.getvalue()


def _infer(model_dir, checkpoint, extra=()):
    console = Console(record=True, width=160)
    run_infer(
        None,
        [f"actor_rollout_ref.model.path={model_dir}", *LIMITS, *extra],
        "What is 4817 * 293?",
        "calculator",
        checkpoint=str(checkpoint),
        console=console,
    )
    line = next(x for x in console.export_text().splitlines() if x.startswith("route: "))
    return line.split()[1], line


def _with_threshold(src, dst, tau):
    """A copy of the checkpoint's router.pt whose τ is ``tau`` (None: no τ, an older file)."""
    state = load_torch_file(src / "router.pt")
    state.pop(THRESHOLD_KEY, None)
    if tau is not None:
        state[THRESHOLD_KEY] = Threshold(tau, 0.3, 1.0, 0.2, 0.2, 6, True, 1).to_state()
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():  # the LM and the rest as they are
        if f.name != "router.pt" and not (dst / f.name).exists():
            (dst / f.name).symlink_to(f)
    torch.save(state, dst / "router.pt")
    return dst


def test_validation_calibrates_and_the_checkpoint_keeps_tau(run, tiny_model_dir):
    ov, ckpt, history, _ = run
    val = history[-1]
    assert val["val/router/headline_sampled"] == 1.0  # B = 0.3 binds
    if val["val/threshold/feasible"]:  # else even ANSWER everywhere spent more than B
        assert val["val/threshold/all/cost_mean"] <= 0.3 + 1e-9
    assert "val/threshold/calibrated_spend" in val and "val/all/p_tool_mean" in val
    saved = Threshold.from_state(load_torch_file(ckpt / "router.pt")[THRESHOLD_KEY])
    assert saved is not None and saved.step == 1 and saved.tasks == 6 and saved.budget == 0.3
    assert saved.spend == pytest.approx(val["val/threshold/calibrated_spend"])
    # a resume restores it (the next checkpoint stores it again even before a validation)
    trainer = Trainer(load_config(TrainConfig, None, [*ov, "trainer.total_training_steps=1"]))
    try:
        assert trainer.router_calibration == saved
    finally:
        trainer.close()
    route, line = _infer(tiny_model_dir, ckpt)
    assert "threshold: P(tool)" in line  # the default routing when the budget binds


def test_infer_routes_by_the_threshold(run, tiny_model_dir, tmp_path):
    _, ckpt, _, _ = run
    always = _with_threshold(ckpt, tmp_path / "always", 0.0)
    route, line = _infer(tiny_model_dir, always)
    assert route in ("SEARCH", "CALCULATE") and ">= τ 0.00" in line
    never = _with_threshold(ckpt, tmp_path / "never", math.inf)
    route, line = _infer(tiny_model_dir, never)
    assert route == "ANSWER"
    _, line = _infer(tiny_model_dir, never, ["router.infer_mode=argmax"])
    assert "threshold" not in line  # argmax stays available


def test_an_older_checkpoint_without_tau_loads_and_falls_back(
    run, tiny_model_dir, tmp_path, caplog
):
    _, ckpt, _, _ = run
    old = _with_threshold(ckpt, tmp_path / "old", None)
    with caplog.at_level(logging.WARNING, logger="toolgrpo.router.infer"):
        route, line = _infer(tiny_model_dir, old)
    assert "no calibrated threshold" in caplog.text and "routing by argmax" in caplog.text
    assert "threshold" not in line
    want, _ = _infer(tiny_model_dir, old, ["router.infer_mode=argmax"])
    assert route == want


def test_validation_fits_the_served_heads_budget_offset_on_training_tasks(run):
    _, ckpt, history, _ = run
    val = history[-1]
    state = load_torch_file(ckpt / "router.pt")
    saved = AnswerOffset.from_state(state[OFFSET_KEY])
    assert saved is not None and saved.step == 1 and saved.budget == 0.3
    assert saved.tasks == val["val/router_offset/tasks"] == 6  # the training set's 6 tasks
    assert saved.delta == pytest.approx(val["val/router_offset/delta"])
    assert saved.binding == (state["budget"]["integral"] > 0)
    if saved.feasible and (saved.binding or saved.spend_before > 0.3):
        assert saved.spend == pytest.approx(0.3, abs=1e-6)
    elif saved.feasible:
        assert saved.delta == 0.0 and saved.spend == saved.spend_before <= 0.3


def test_eval_fits_an_offset_for_a_checkpoint_saved_without_one(run, tmp_path):
    ov, ckpt, _, _ = run
    old = _with_threshold(ckpt, tmp_path / "old", 0.5)
    state = load_torch_file(old / "router.pt")
    state.pop(OFFSET_KEY)
    torch.save(state, old / "router.pt")
    out = tmp_path / "eval" / "e.json"
    assert run_eval(None, ov, str(old), str(out), -1, 0, fit_offset=True) == 0
    fit = AnswerOffset.from_state(load_torch_file(old / "router.pt")[OFFSET_KEY])
    assert fit is not None and fit.tasks == 6 and fit.step == 1
    routing = json.loads(out.read_text())["routing"]
    assert AnswerOffset.from_state(routing["offset"]) == fit
    assert "in-sample" in routing["threshold"]["source"]  # τ fit for the unshifted head: refit
    off = [*ov, "router.enable=false"]  # no head to fit: refused before any model loads
    with pytest.raises(ConfigError, match="--fit-offset"):
        run_eval(None, off, None, str(tmp_path / "e2.json"), -1, 0, fit_offset=True)


def test_validation_progress_counts_every_route_and_the_offset_fit(run):
    """Routed validation plays every validation task under every route, and the offset fit
    every training task under every route, ``router.offset_n`` episodes each: the console's
    phase lines count those episodes, not the validation tasks."""
    *_, err = run
    lines = [x for x in err.splitlines() if x.startswith("step 1 ")]
    assert any(x.startswith("step 1 offset fit: 36 episodes in ") for x in lines), lines  # 6×3×2
    assert any(x.startswith("step 1 validation: 18 episodes in ") for x in lines), lines  # 6×3×1
