"""``toolgrpo infer`` with a router: a trained checkpoint's head, a fresh head on the base model,
and a forced route."""

from __future__ import annotations

import pytest
from rich.console import Console

from toolgrpo.cli import main
from toolgrpo.infer import run_infer
from toolgrpo.router.prompts import ANSWER_NOTE
from toolgrpo.trainer.trainer import Trainer

LIMITS = [
    "data.max_response_length=12",
    "actor_rollout_ref.rollout.multi_turn.max_tokens_per_turn=6",
]


@pytest.fixture
def checkpoint(make_train_config, tmp_path):
    cfg = make_train_config(
        steps=1, out=tmp_path / "run", **{"router.enable": "true", "router.freeze_lm": "true"}
    )
    Trainer(cfg).fit()
    return tmp_path / "run" / "checkpoints" / "global_step_1"


def _infer(model_dir, checkpoint=None, extra=(), route=None):
    console = Console(record=True, width=160)
    ep = run_infer(
        None,
        [f"actor_rollout_ref.model.path={model_dir}", *LIMITS, *extra],
        "What is 4817 * 293?",
        "calculator",
        checkpoint=str(checkpoint) if checkpoint else None,
        console=console,
        route=route,
    )
    return ep, console.export_text()


def test_infer_routes_with_a_trained_checkpoint(tiny_model_dir, checkpoint):
    assert (checkpoint / "router.pt").is_file()
    ep, text = _infer(tiny_model_dir, checkpoint)
    line = next(x for x in text.splitlines() if x.startswith("route: "))
    route = line.split()[1]
    assert all(r in line for r in ("ANSWER", "SEARCH", "CALCULATE")) and "fresh" not in line
    assert (ANSWER_NOTE in ep.messages[0]["content"]) == (route == "ANSWER")
    assert ep.num_turns >= 1


def test_infer_on_the_base_model_with_a_fresh_head(tiny_model_dir):
    ep, text = _infer(tiny_model_dir, extra=["router.enable=true"])
    assert "route: ANSWER   [ANSWER 0.33  SEARCH 0.33  CALCULATE 0.33] (fresh head" in text
    assert ep.messages[0]["content"].endswith(ANSWER_NOTE)
    _, plain = _infer(tiny_model_dir)  # no router: no route line, the prompt as given
    assert "route:" not in plain


def test_forced_route_and_a_bad_one(tiny_model_dir, capsys):
    ep, text = _infer(tiny_model_dir, route="calculate")
    assert "route: CALCULATE" in text and "exact computation" in ep.messages[0]["content"]
    argv = ["infer", "--route", "BROWSE", f"actor_rollout_ref.model.path={tiny_model_dir}", "hi"]
    assert main(argv) == 2 and "unknown route 'BROWSE'" in capsys.readouterr().err


def test_infer_plays_a_checkpoint_with_its_saved_families_and_gates():
    """Issue 18 item 1: ``toolgrpo infer`` builds a route's prompt from the families saved in
    router.pt (main re-derived them from the heuristic and the current families_file), and its
    ANSWER route refuses calls as training's does."""
    import asyncio

    from toolgrpo.data.loader import load_tasks
    from toolgrpo.envs.registry import EnvRouter
    from toolgrpo.router.infer import conditioner
    from toolgrpo.tools.types import ToolCall

    task = load_tasks(["calculator:train"], max_samples=1).tasks[0]
    start = asyncio.run(EnvRouter().make(task).reset())
    spec = {"families": {"calculate": "SEARCH", "solve": "CALCULATE"}, "family_tools_only": True}
    cond = conditioner("SEARCH", spec=spec)
    kept = [s["function"]["name"] for s in cond(start).tools]
    assert kept == ["calculate"]  # saved: calculate is a SEARCH tool here; solve is dropped
    assert cond.refuse(ToolCall("solve")) and cond.refuse(ToolCall("calculate")) is None
    answer = conditioner("ANSWER")
    assert answer(start).tools == [] and answer.refuse(ToolCall("calculate")).startswith("Error")
