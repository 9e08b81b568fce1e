"""``toolgrpo infer`` on the tiny model: one episode, printed turn by turn."""

from __future__ import annotations

from rich.console import Console

from tests.conftest import GROUND_TRUTH
from toolgrpo.cli import main
from toolgrpo.infer import run_infer


def test_infer_prints_the_episode(tiny_model_dir, tmp_path):
    console = Console(record=True, width=120)
    ep = run_infer(
        None,
        [
            f"actor_rollout_ref.model.path={tiny_model_dir}",
            "data.max_response_length=12",
            f"trainer.output_dir={tmp_path}",
        ],
        "call f 1",
        "rlla",
        ground_truth=GROUND_TRUTH,
        system="You call tools.",
        console=console,
    )
    text = console.export_text()
    assert "assistant" in text and "call f 1" in text and f"stop={ep.stop_reason}" in text
    assert ep.num_turns == 1 and "reward=" in text and 0 < len(ep.response_ids) <= 12
    assert (tmp_path / "run.log").is_file()  # the libraries' lines, as train's and eval's


def test_infer_unknown_task_type_is_a_clear_error(tiny_model_dir, capsys):
    code = main(
        ["infer", "--task-type", "nope", f"actor_rollout_ref.model.path={tiny_model_dir}", "hello"]
    )
    assert code == 2 and "no environment for task_type 'nope'" in capsys.readouterr().err


def test_printed_episode_shows_tool_calls_and_results(tiny_model_dir):
    from transformers import AutoTokenizer

    from tests.rollout.test_multi_turn import CALL, AddEnv, _play
    from toolgrpo.infer import print_episode

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    ep, _ = _play(tok, [CALL, "<answer>5</answer>"], AddEnv())
    console = Console(record=True, width=120)
    print_episode(ep, console)
    text = console.export_text()
    assert '"name": "add"' in text and "tool · add" in text and "RESULT=5" in text
    assert "turns=2 tool_calls=1 tool_errors=0 stop=answer reward=1.000" in text
