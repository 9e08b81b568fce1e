"""``toolgrpo eval`` (and the CLI's error handling) on the tiny model."""

from __future__ import annotations

import json

import pytest

from tests.conftest import train_overrides
from toolgrpo.cli import main
from toolgrpo.config.loader import load_config
from toolgrpo.config.schema import TrainConfig
from toolgrpo.eval.cli import apply_checkpoint
from toolgrpo.trainer.trainer import Trainer

KEYS = ("num_tasks", "num_samples", "reward_mean", "format_rate", "exact_call_rate")


def _eval_overrides(model_dir, data) -> list[str]:
    return [
        f"actor_rollout_ref.model.path={model_dir}",
        "actor_rollout_ref.model.dtype=float32",
        f"data.val_files=[{data}]",
        "data.max_prompt_length=4096",
        "data.max_response_length=8",
    ]


def test_eval_writes_json(tiny_model_dir, tiny_data, tmp_path):
    out = tmp_path / "eval.json"
    rc = main(
        [
            "eval",
            "--output",
            str(out),
            "--limit",
            "2",
            "--samples",
            "1",
            *_eval_overrides(tiny_model_dir, tiny_data),
        ]
    )
    assert rc == 0
    res = json.loads(out.read_text())
    for k in KEYS:
        assert k in res, k
    assert res["num_tasks"] == 2 and res["num_samples"] == 2
    assert 0.0 <= res["format_rate"] <= 1.0
    assert 0.0 <= res["exact_call_rate"] <= 1.0
    assert isinstance(res["reward_mean"], float)
    assert res["model"] == str(tiny_model_dir)
    assert res["val_files"] == [str(tiny_data)]
    assert len(res["samples"]) == 1 and res["samples"][0]["task_id"].endswith("#0")
    assert (tmp_path / "run.log").is_file()  # the libraries' lines, as train's and sft's

    # greedy evaluation is reproducible (and the first eval let go of the folder)
    out2 = tmp_path / "eval2.json"
    assert (
        main(
            [
                "eval",
                "--output",
                str(out2),
                "--limit",
                "2",
                *_eval_overrides(tiny_model_dir, tiny_data),
            ]
        )
        == 0
    )
    res2 = json.loads(out2.read_text())
    assert res2["reward_mean"] == res["reward_mean"]
    assert res2["response_length_mean"] == res["response_length_mean"]


@pytest.mark.parametrize("lora", [False, True])
def test_eval_checkpoint(tiny_model_dir, tiny_data, tmp_path, lora):
    run = tmp_path / "run"
    extra = {"actor_rollout_ref.model.lora_rank": 4} if lora else {}
    cfg = load_config(
        TrainConfig, None, train_overrides(tiny_model_dir, tiny_data, run, 1, **extra)
    )
    Trainer(cfg).fit()
    ckpt = run / "checkpoints" / "global_step_1"
    assert ckpt.is_dir()
    out = tmp_path / "ckpt_eval.json"
    rc = main(
        [
            "eval",
            "--checkpoint",
            str(ckpt),
            "--output",
            str(out),
            "--limit",
            "2",
            *_eval_overrides(tiny_model_dir, tiny_data),
        ]
    )
    assert rc == 0
    res = json.loads(out.read_text())
    assert res["model"] == str(ckpt)
    assert res["num_tasks"] == 2


def test_apply_checkpoint_variants(tiny_model_dir, tmp_path):
    cfg = load_config(TrainConfig, None, [f"actor_rollout_ref.model.path={tiny_model_dir}"])
    adapter_ckpt = tmp_path / "a"
    (adapter_ckpt / "adapter").mkdir(parents=True)
    (adapter_ckpt / "adapter" / "adapter_config.json").write_text("{}")
    apply_checkpoint(cfg, str(adapter_ckpt))
    assert cfg.actor_rollout_ref.model.adapter_path == str(adapter_ckpt / "adapter")
    assert cfg.actor_rollout_ref.model.path == str(tiny_model_dir)

    cfg = load_config(TrainConfig, None, ["actor_rollout_ref.model.lora_rank=8"])
    apply_checkpoint(cfg, str(tiny_model_dir))  # a plain HF dir
    assert cfg.actor_rollout_ref.model.path == str(tiny_model_dir)
    assert cfg.actor_rollout_ref.model.lora_rank == 0

    with pytest.raises(FileNotFoundError, match="neither"):
        apply_checkpoint(cfg, str(tmp_path / "nothing"))


def test_eval_bad_checkpoint_exit_code(tiny_model_dir, tiny_data, tmp_path, capsys):
    rc = main(
        [
            "eval",
            "--checkpoint",
            str(tmp_path / "nope"),
            "--output",
            str(tmp_path / "o"),
            *_eval_overrides(tiny_model_dir, tiny_data),
        ]
    )
    assert rc == 2
    assert "neither a checkpoint nor a model directory" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["train", "eval", "sft"])
def test_cli_typo_key_exit_code_2(command, capsys):
    rc = main([command, "data.train_batch_sise=4"])
    assert rc == 2
    err = capsys.readouterr().err
    assert f"toolgrpo {command}: error:" in err
    assert "unknown key 'data.train_batch_sise'" in err
    assert "did you mean 'data.train_batch_size'" in err
    assert "Traceback" not in err


def test_cli_missing_config_file(capsys, tmp_path):
    assert main(["train", str(tmp_path / "missing.yaml")]) == 2
    assert "config file not found" in capsys.readouterr().err


def test_cli_missing_data_file_eval(tiny_model_dir, tmp_path, capsys):
    missing = tmp_path / "nope.jsonl"
    rc = main(
        ["eval", "--output", str(tmp_path / "e.json"), *_eval_overrides(tiny_model_dir, missing)]
    )
    assert rc == 2
    err = capsys.readouterr().err
    assert "toolgrpo eval: error:" in err
    assert "data file not found" in err and str(missing) in err
    assert not (tmp_path / "e.json").exists()


def test_cli_missing_data_file_train(tiny_model_dir, tmp_path, capsys):
    missing = tmp_path / "nope.jsonl"
    rc = main(["train", *train_overrides(tiny_model_dir, missing, tmp_path / "run", 1)])
    assert rc == 2
    err = capsys.readouterr().err
    assert "toolgrpo train: error:" in err and "data file not found" in err


def test_cli_missing_model(tmp_path, tiny_data, capsys):
    rc = main(
        [
            "eval",
            "--output",
            str(tmp_path / "e.json"),
            *_eval_overrides(tmp_path / "no_model", tiny_data),
        ]
    )
    assert rc == 2
    assert "nothing is downloaded" in capsys.readouterr().err


def test_cli_train_runs(tiny_model_dir, tiny_data, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", *train_overrides(tiny_model_dir, tiny_data, run, 1)]) == 0
    cap = capsys.readouterr()
    # The end summary ends it (a raw JSON line of rewards and "outputs in ..." used to follow)
    assert not any(line.startswith("{") for line in cap.out.splitlines())
    assert "outputs in" not in cap.out and f"outputs: {run}" in cap.err
    last = [line for line in cap.err.splitlines() if line.strip()][-1]
    assert last.startswith(("report: toolgrpo report", "TensorBoard: ")), last
    assert (run / "checkpoints" / "global_step_1").is_dir()


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (
            {"data.train_batch_size": 16, "actor_rollout_ref.actor.ppo_mini_batch_size": 16},
            "exceeds the 8 usable training tasks",
        ),
        (
            {"data.filter_overlong_prompts": "true", "data.max_prompt_length": 5},
            "every prompt exceeds",
        ),
    ],
)
def test_cli_train_startup_errors_exit_code_2(
    tiny_model_dir, tiny_data, tmp_path, capsys, extra, needle
):
    rc = main(["train", *train_overrides(tiny_model_dir, tiny_data, tmp_path / "run", 1, **extra)])
    assert rc == 2
    assert needle in capsys.readouterr().err
