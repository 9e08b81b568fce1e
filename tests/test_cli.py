"""What users get wrong ends in one line and exit code 2, not a traceback (issue 15, item 7);
data and settings are checked before the model loads; bugs keep their traceback."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import rlla_row, train_overrides
from toolgrpo.cli import main
from toolgrpo.rewards.scoring import Score
from toolgrpo.trainer import rollout_stage

SRC = Path(__file__).resolve().parents[1] / "src"


def _error_line(capsys, command: str) -> str:
    """The single error line of a failed command (stderr may also hold log warnings)."""
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith(f"toolgrpo {command}: error:")]
    assert len(lines) == 1, err
    return lines[0]


@pytest.fixture
def no_model(monkeypatch):
    """Loading the model fails loudly: the errors under test must come before it."""

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the input was checked")

    monkeypatch.setattr("toolgrpo.trainer.trainer.start_policy", refuse)
    monkeypatch.setattr("toolgrpo.eval.cli.load_policy", refuse)
    monkeypatch.setattr("toolgrpo.sft.trainer.load_policy", refuse)


def _train(model, data, out, steps=1, **extra) -> list[str]:
    return ["train", *train_overrides(model, data, out, steps, **extra)]


def test_yaml_whose_top_level_is_a_list(tmp_path, capsys):
    """Was ``TypeError: Cannot merge incompatible container types`` with a traceback."""
    f = tmp_path / "list.yaml"
    f.write_text("- data: {train_batch_size: 4}\n- trainer: {}\n")
    assert main(["train", str(f)]) == 2
    line = _error_line(capsys, "train")
    assert "list.yaml" in line and "top level must be a mapping" in line


def test_yaml_list_from_the_real_command_line(tmp_path):
    """The installed entry point: exit status 2 and one line on stderr."""
    f = tmp_path / "list.yaml"
    f.write_text("- a\n- b\n")
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
    p = subprocess.run(
        [sys.executable, "-m", "toolgrpo.cli", "train", str(f)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr
    assert p.stderr.strip().count("\n") == 0 and "top level must be a mapping" in p.stderr


def _latin1_data(path: Path, good_rows: int) -> Path:
    lines = [json.dumps(rlla_row(i)).encode() for i in range(good_rows)]
    lines.insert(min(1, good_rows), '{"caf\xe9": 1}'.encode("latin-1"))
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def test_non_utf8_jsonl_with_bad_rows_error(tiny_model_dir, tmp_path, capsys, no_model):
    data = _latin1_data(tmp_path / "d.jsonl", 4)
    rc = main(_train(tiny_model_dir, data, tmp_path / "run", **{"data.bad_rows": "error"}))
    assert rc == 2
    line = _error_line(capsys, "train")
    assert "d.jsonl row 1: not valid UTF-8" in line


def test_non_utf8_jsonl_with_bad_rows_skip_has_no_usable_rows(
    tiny_model_dir, tmp_path, capsys, no_model
):
    """With skip, the bad line is skipped and reported (here it is the only row)."""
    data = _latin1_data(tmp_path / "d.jsonl", 0)
    rc = main(_train(tiny_model_dir, data, tmp_path / "run", **{"data.bad_rows": "skip"}))
    assert rc == 2
    assert "no usable rows" in _error_line(capsys, "train")


def test_corrupt_parquet(tiny_model_dir, tmp_path, capsys, no_model):
    data = tmp_path / "d.parquet"
    data.write_bytes(b"PAR1 this is not parquet")
    assert main(_train(tiny_model_dir, data, tmp_path / "run")) == 2
    assert "d.parquet: not a readable parquet file" in _error_line(capsys, "train")


def test_unknown_logger_is_refused_before_the_model_loads(
    tiny_model_dir, tiny_data, tmp_path, capsys, no_model
):
    """Was raised by the Tracker, after the model had loaded, as a traceback."""
    args = _train(tiny_model_dir, tiny_data, tmp_path / "run", **{"trainer.logger": "[comet]"})
    assert main(args) == 2
    line = _error_line(capsys, "train")
    assert "trainer.logger='comet' is not one of console, jsonl, tensorboard, wandb, mlflow" in line


def test_bad_val_file_is_refused_before_the_model_loads(
    tiny_model_dir, tiny_data, tmp_path, capsys, no_model
):
    """Validation data was first read at the first validation step, mid-run."""
    bad = _latin1_data(tmp_path / "val.jsonl", 0)
    args = _train(tiny_model_dir, tiny_data, tmp_path / "run", **{"trainer.test_freq": 1})
    args = [a for a in args if not a.startswith("data.val_files=")] + [f"data.val_files=[{bad}]"]
    assert main(args) == 2
    assert "no usable rows" in _error_line(capsys, "train")


def test_nan_reward_under_nan_policy_error(
    tiny_model_dir, tiny_data, tmp_path, capsys, monkeypatch
):
    """NonFiniteReward was not among the errors the CLI prints: a traceback."""
    nan = Score(float("nan"), float("nan"), 0.0, 0.0, False, None)
    monkeypatch.setattr(rollout_stage, "score", lambda task, text, step, flags: nan)
    assert main(_train(tiny_model_dir, tiny_data, tmp_path / "run")) == 2
    line = _error_line(capsys, "train")
    assert "non-finite reward" in line and "#" in line  # names the task


def test_nan_reward_on_the_async_rollout_thread(
    tiny_model_dir, tiny_data, tmp_path, capsys, monkeypatch
):
    """Raised on the rollout thread, it reached the CLI wrapped in a RuntimeError: a traceback."""
    nan = Score(float("nan"), float("nan"), 0.0, 0.0, False, None)
    monkeypatch.setattr(rollout_stage, "score", lambda task, text, step, flags: nan)
    args = _train(tiny_model_dir, tiny_data, tmp_path / "run", **{"async_training.enable": "true"})
    assert main(args) == 2
    assert "non-finite reward" in _error_line(capsys, "train")


def test_truncation_error_mid_run(tiny_model_dir, tiny_data, tmp_path, capsys):
    """data.truncation=error raises PromptTooLong at rollout time: one line, not a traceback."""
    extra = {"data.truncation": "error", "data.max_prompt_length": 8}
    assert main(_train(tiny_model_dir, tiny_data, tmp_path / "run", **extra)) == 2
    assert "data.max_prompt_length=8" in _error_line(capsys, "train")


def test_eval_refuses_tasks_it_cannot_score_before_generating(
    tiny_model_dir, tmp_path, capsys, no_model
):
    """Was raised by the reward after every task had been generated."""
    rc = main(
        [
            "eval",
            "--output",
            str(tmp_path / "e.json"),
            f"actor_rollout_ref.model.path={tiny_model_dir}",
            "data.val_files=[calculator:test]",
            "router.enable=true",
        ]
    )
    assert rc == 2
    line = _error_line(capsys, "eval")
    assert "router.enable=true but no --checkpoint given" in line
    assert not (tmp_path / "e.json").exists()


def test_training_validation_on_tasks_it_cannot_score(
    tiny_model_dir, tiny_data, tmp_path, capsys, no_model
):
    """Single-turn validation of calculator tasks failed in the reward at the first validation."""
    args = _train(tiny_model_dir, tiny_data, tmp_path / "run", **{"trainer.test_freq": 1})
    args = [a for a in args if not a.startswith("data.val_files=")]
    assert main([*args, "data.val_files=[calculator:test]"]) == 2
    assert "multi_turn.enable=true" in _error_line(capsys, "train")


def _broken_copy(src: Path, dst: Path, how: str) -> Path:
    shutil.copytree(src, dst)
    if how == "config":
        (dst / "config.json").write_text("{not json")
    elif how == "truncated":
        w = dst / "model.safetensors"
        w.write_bytes(w.read_bytes()[: w.stat().st_size // 2])
    elif how == "no_weights":
        (dst / "model.safetensors").unlink()
    elif how == "tokenizer":
        (dst / "tokenizer.json").write_text("garbage")
    return dst


@pytest.mark.parametrize("how", ["config", "truncated", "no_weights", "tokenizer"])
@pytest.mark.parametrize("command", ["train", "eval"])
def test_corrupt_model_directory_names_the_path(
    tiny_model_dir, tiny_data, tmp_path, capsys, how, command
):
    model = _broken_copy(tiny_model_dir, tmp_path / f"broken_{how}", how)
    if command == "train":
        args = _train(model, tiny_data, tmp_path / "run")
    else:
        args = ["eval", "--output", str(tmp_path / "e.json")]
        args += [f"actor_rollout_ref.model.path={model}", f"data.val_files=[{tiny_data}]"]
    assert main(args) == 2
    line = _error_line(capsys, command)
    assert str(model) in line and "cannot load the" in line


def test_corrupt_lora_adapter_names_the_path(tiny_model_dir, tiny_data, tmp_path, capsys):
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{oops")
    args = _train(tiny_model_dir, tiny_data, tmp_path / "run")
    assert main([*args, f"actor_rollout_ref.model.adapter_path={adapter}"]) == 2
    assert f"cannot load the LoRA adapter at {adapter}" in _error_line(capsys, "train")


def test_sft_reads_its_data_before_the_model(tiny_model_dir, tmp_path, capsys, no_model):
    data = _latin1_data(tmp_path / "sft.jsonl", 2)
    rc = main(["sft", f"model.path={tiny_model_dir}", f"data.train_files=[{data}]"])
    assert rc == 2
    assert "sft.jsonl" in _error_line(capsys, "sft")


def test_bad_sft_setting_is_one_line(tiny_model_dir, capsys, no_model):
    """SFT settings were not validated at all (warmup_style=linear ran as constant)."""
    rc = main(
        ["sft", f"model.path={tiny_model_dir}", "optim.warmup_style=linear", "trainer.logger=[]"]
    )
    assert rc == 2
    assert "optim.warmup_style='linear' is not one of constant, cosine" in _error_line(
        capsys, "sft"
    )


def test_a_bug_keeps_its_traceback(tiny_model_dir, tiny_data, tmp_path, monkeypatch):
    """The other side: an error that is not the user's is not swallowed into one line."""

    def broken(*args, **kwargs):
        raise KeyError("internal bookkeeping")

    monkeypatch.setattr("toolgrpo.trainer.trainer.Trainer.fit", broken)
    with pytest.raises(KeyError, match="internal bookkeeping"):
        main(_train(tiny_model_dir, tiny_data, tmp_path / "run"))


def test_a_config_path_with_an_equals_sign_is_the_config_not_an_override():
    """Run directories named like ``B=0.3`` hold configs; ``key=some.yaml`` stays an override."""
    from toolgrpo.cli import _split

    path = "/runs/router/B=0.3/config.yaml"
    cfg, overrides = _split([path, "router.budget=0.3", "router.families_file=f.yaml"])
    assert cfg == path
    assert overrides == ["router.budget=0.3", "router.families_file=f.yaml"]
    assert _split(["router.families_file=f.yaml"]) == (None, ["router.families_file=f.yaml"])


def test_options_after_the_overrides_count_as_options(monkeypatch, capsys):
    """Was: ``train cfg.yaml --help`` and ``eval k=v --limit 2`` said "override '--help' is not
    of the form key=value"."""
    with pytest.raises(SystemExit) as e:
        main(["train", "configs/x.yaml", "--help"])
    assert e.value.code == 0 and "usage: toolgrpo train" in capsys.readouterr().out
    seen: dict = {}
    monkeypatch.setattr("toolgrpo.eval.cli.run_eval", lambda *a, **k: seen.update(a=a) or 0)
    assert main(["eval", "data.val_max_samples=3", "--limit", "2", "--output=o.json"]) == 0
    path, overrides, _ckpt, output, limit = seen["a"][:5]
    assert (path, overrides, output, limit) == (None, ["data.val_max_samples=3"], "o.json", 2)
    monkeypatch.setattr("toolgrpo.infer.run_infer", lambda *a, **k: seen.update(i=(a, k)))
    assert main(["infer", "what is -5 + 3?", "--sample", "--task-type", "direct"]) == 0
    (_path, _over, prompt, task_type), kw = seen["i"]
    assert prompt == "what is -5 + 3?" and task_type == "direct" and kw["sample"] is True


def test_an_unknown_option_after_the_overrides_is_named(capsys):
    with pytest.raises(SystemExit) as e:
        main(["eval", "data.val_max_samples=3", "--limt", "2"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "toolgrpo eval: error: unknown option '--limt'" in err and "--limit" in err
