"""The pure parts of benchmarks/vs_trl.py: toolgrpo config → TRL GRPOConfig arguments, per-step
rows from each side's logs, the summary and ratio, and the peak-RSS measurement of a child."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from toolgrpo.config.loader import load_config
from toolgrpo.config.schema import TrainConfig

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

from vs_trl_lib import (  # noqa: E402
    MappingError,
    RunResult,
    StepRow,
    ratios,
    run_measured,
    summarize,
    toolgrpo_steps,
    trl_grpo_args,
    trl_steps,
)

RLLA = str(REPO / "configs" / "grpo_smollm2_rlla.yaml")


def _cfg(*overrides: str) -> TrainConfig:
    return load_config(TrainConfig, RLLA, list(overrides))


def test_rlla_job_maps_to_one_trl_optimizer_step_of_the_same_samples():
    """TRL sees the RLLA job's group size, lengths, sampling, optimiser and loss normalisation,
    with micro-batches of 4 accumulated into one optimizer step over the step's 16 samples."""
    got = trl_grpo_args(_cfg(), "float32", steps=3, output_dir="/x", micro_batch=4)
    assert got["num_generations"] == 4
    assert got["generation_batch_size"] == 16  # 4 prompts x n=4, one generate round
    assert got["per_device_train_batch_size"] * got["gradient_accumulation_steps"] == 16
    assert got["per_device_train_batch_size"] == 4
    assert got["max_completion_length"] == 128 and got["max_steps"] == 3
    assert (got["temperature"], got["top_p"], got["top_k"]) == (1.0, 1.0, 0)
    assert got["learning_rate"] == pytest.approx(1e-4)
    assert (got["epsilon"], got["epsilon_high"], got["beta"]) == (0.2, 0.2, 0.0)
    assert got["loss_type"] == "dapo" and got["scale_rewards"] == "group"
    assert got["bf16"] is False and got["fp16"] is False and got["use_cpu"] is True
    assert got["shuffle_dataset"] is False  # prompts come in toolgrpo's order
    assert got["lr_scheduler_type"] == "constant" and got["max_grad_norm"] == 1.0


def test_mapping_follows_the_config_it_is_given():
    got = trl_grpo_args(
        _cfg(
            "algorithm.adv_estimator=dr_grpo",
            "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm",
            "actor_rollout_ref.actor.clip_ratio_high=0.28",
            "actor_rollout_ref.actor.use_kl_loss=true",
            "actor_rollout_ref.actor.kl_loss_coef=0.01",
            "actor_rollout_ref.rollout.top_k=20",
            "actor_rollout_ref.actor.ppo_epochs=2",
        ),
        "bfloat16",
        steps=1,
        output_dir="/x",
        micro_batch=8,
    )
    assert got["loss_type"] == "dr_grpo" and got["scale_rewards"] == "none"
    assert (got["epsilon"], got["epsilon_high"]) == (0.2, 0.28)
    assert got["beta"] == 0.01 and got["top_k"] == 20 and got["num_iterations"] == 2
    assert got["bf16"] is True and got["gradient_accumulation_steps"] == 2


@pytest.mark.parametrize(
    "overrides, micro",
    [
        (["actor_rollout_ref.actor.ppo_mini_batch_size=2"], 4),  # two optimizer steps a step
        (["actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum"], 4),
        (["algorithm.adv_estimator=gae"], 4),
        (["actor_rollout_ref.actor.entropy_coeff=0.01"], 4),
        ([], 3),  # 16 completions do not split into 3s
    ],
)
def test_settings_trl_cannot_match_are_refused(overrides, micro):
    with pytest.raises(MappingError):
        trl_grpo_args(_cfg(*overrides), "float32", 1, "/x", micro_batch=micro)


def test_step_rows_from_each_sides_logs(tmp_path):
    tg = tmp_path / "metrics.jsonl"
    lines = [
        {"step": 0, "val/reward/mean": 0.5},  # validation before training: no step time
        {
            "step": 1,
            "timing/step_s": 10.0,
            "timing/gen_s": 4.0,
            "timing/train_s": 5.5,
            "tokens/generated": 800.0,
            "prompt_length/mean": 700.0,
            "batch/size": 16.0,
            "reward/mean": -1.5,
        },
    ]
    tg.write_text("".join(json.dumps(x) + "\n" for x in lines))
    (row,) = toolgrpo_steps(tg)
    assert (row.step, row.step_s, row.gen_s, row.update_s) == (1, 10.0, 4.0, 6.0)
    assert row.prompt_tokens == 700.0 * 16 and row.reward_mean == -1.5
    assert row.extra["timing/train_s"] == 5.5
    trl = tmp_path / "trl.jsonl"
    trl.write_text(
        json.dumps(
            {
                "step": 1,
                "step_s": 30.0,
                "gen_s": 12.0,
                "gen_and_score_s": 12.5,
                "gen_tokens": 640,
                "prompt_tokens": 11200,
                "reward_mean": 0.25,
            }
        )
        + "\n"
    )
    (row,) = trl_steps(trl)
    assert (row.update_s, row.gen_tokens, row.reward_mean) == (18.0, 640, 0.25)
    assert row.extra["score_s"] == pytest.approx(0.5)


def _row(step: int, step_s: float, gen_s: float, gen_tokens: float = 100.0) -> StepRow:
    return StepRow(step, step_s, gen_s, gen_tokens, prompt_tokens=900.0, reward_mean=1.0)


def test_summary_leaves_out_warm_up_and_failed_runs_and_takes_the_ratio():
    runs = [
        RunResult("toolgrpo", 1, 0, 60.0, 5.0, [_row(1, 99.0, 90.0), _row(2, 10.0, 4.0)]),
        RunResult("trl", 1, 0, 200.0, 17.0, [_row(1, 99.0, 9.0), _row(2, 40.0, 10.0)]),
        RunResult("toolgrpo", 2, 0, 60.0, 6.0, [_row(1, 99.0, 90.0), _row(2, 20.0, 5.0)]),
        RunResult("trl", 2, -9, 50.0, 23.6, [_row(1, 99.0, 9.0)], "killed by signal 9"),
    ]
    s = summarize(runs, warmup_steps=1)
    assert s["toolgrpo"]["steps_measured"] == 2 and s["toolgrpo"]["step_s"] == 15.0
    assert s["toolgrpo"]["update_s"] == pytest.approx(10.5)  # median of 6 and 15
    assert s["toolgrpo"]["gen_tokens_per_s"] == pytest.approx((25.0 + 20.0) / 2)
    assert s["toolgrpo"]["step_tokens_per_s"] == pytest.approx((100.0 + 50.0) / 2)
    assert s["toolgrpo"]["peak_rss_gb"] == 6.0
    assert (s["trl"]["runs_ok"], s["trl"]["runs_failed"], s["trl"]["step_s"]) == (1, 1, 40.0)
    assert s["trl"]["peak_rss_gb"] == 23.6  # a run killed for memory still shows its peak
    assert ratios(s) == {"toolgrpo/trl": pytest.approx(15.0 / 40.0)}
    one = summarize([RunResult("trl", 1, 0, 9.0, 1.0, [_row(1, 8.0, 2.0)])], warmup_steps=1)
    assert one["trl"]["step_s"] == 8.0  # a one-step run (--tiny) keeps its only step
    failed = summarize([RunResult("trl", 1, 1, 9.0, 1.0, [])])
    assert math.isnan(failed["trl"]["step_s"])
    assert math.isnan(ratios({**s, "trl": failed["trl"]})["toolgrpo/trl"])


def test_run_measured_sees_a_childs_peak_memory_and_its_exit(tmp_path):
    code = "import time; b = bytearray(300 * 2**20); b[::4096] = b'x' * len(b[::4096]); "
    code += "time.sleep(0.6); raise SystemExit(3)"
    rc, wall, peak = run_measured([sys.executable, "-c", code], {}, tmp_path / "log", 0.1)
    assert rc == 3 and wall > 0.5
    assert 0.29 < peak < 2.0
