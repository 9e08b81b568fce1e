"""Issue 15 item 8: resuming with a changed config shows what differs, applies what can apply
(optimizer hyperparameters from the config, not the checkpoint) and refuses the rest."""

from __future__ import annotations

import pytest

from tests.trainer.ckpt_runs import copy_run, finished_run, grpo_config
from toolgrpo.config.loader import ConfigError
from toolgrpo.trainer.config_diff import config_changes
from toolgrpo.trainer.trainer import Trainer

LR = "actor_rollout_ref.actor.optim.lr"


@pytest.fixture(scope="module")
def base_run(tiny_model_dir, tiny_data, tmp_path_factory):
    return finished_run(
        tiny_model_dir, tiny_data, tmp_path_factory.mktemp("base") / "run", **{LR: 1e-3}
    )


def test_changed_lr_and_weight_decay_apply_and_are_shown(
    base_run, tiny_model_dir, tiny_data, tmp_path, capsys
):
    """Pins: the optimizer's saved param groups silently kept the old lr and weight decay."""
    out = copy_run(base_run, tmp_path / "run")
    extra = {LR: 3e-3, "actor_rollout_ref.actor.optim.weight_decay": 0.05}
    trainer = Trainer(grpo_config(tiny_model_dir, tiny_data, out, steps=3, **extra))
    assert trainer.step == 2
    group = trainer.actor.optimizer.param_groups[0]
    assert group["lr"] == pytest.approx(3e-3) and group["weight_decay"] == 0.05
    assert trainer.actor.scheduler.base_lrs == [pytest.approx(3e-3)]
    assert trainer.actor.optimizer.state  # Adam moments are still the checkpoint's
    err = capsys.readouterr().err
    assert f"{LR}: 0.001 → 0.003 (applied" in err
    assert "trainer.total_training_steps: 2 → 3" in err
    assert "trainer.resume" not in err and "output_dir" not in err
    trainer.fit()  # and the step runs with it
    assert trainer.step == 3


def test_unchanged_config_keeps_the_optimizer_exactly(
    base_run, tiny_model_dir, tiny_data, tmp_path
):
    out = copy_run(base_run, tmp_path / "run")
    trainer = Trainer(grpo_config(tiny_model_dir, tiny_data, out, steps=2, **{LR: 1e-3}))
    assert trainer.actor.optimizer.param_groups[0]["lr"] == 1e-3


def test_changed_lora_rank_is_refused_in_one_line(tiny_model_dir, tiny_data, tmp_path):
    """Pins: a LoRA rank change ended in a size-mismatch traceback."""
    out = tmp_path / "lora"
    rank = "actor_rollout_ref.model.lora_rank"
    Trainer(grpo_config(tiny_model_dir, tiny_data, out, steps=1, **{rank: 4})).fit()
    with pytest.raises(ConfigError, match=f"{rank} 4 → 8 changed") as err:
        Trainer(grpo_config(tiny_model_dir, tiny_data, out, steps=2, **{rank: 8}))
    assert "\n" not in str(err.value) and "new trainer.output_dir" in str(err.value)


def test_changes_are_dotted_and_ignore_where_the_run_lives():
    old = {"trainer": {"resume": "auto", "output_dir": "a", "save_freq": 1}, "x": {"y": [1]}}
    new = {"trainer": {"resume": "disable", "output_dir": "b", "save_freq": 2}, "x": {"y": (1,)}}
    new["only_new"] = 1  # a key from a newer schema: not a change
    (c,) = config_changes(old, new)
    assert (c.key, c.old, c.new) == ("trainer.save_freq", 1, 2)
    assert "takes effect from step 6" in c.describe(5)


def test_sft_lr_change_applies(tiny_model_dir, tiny_data, tmp_path, capsys):
    """Pins: ``toolgrpo sft`` resume kept the checkpoint's learning rate."""
    from tests.sft.test_sft import _sft_config
    from toolgrpo.sft.trainer import SFTTrainer

    out = tmp_path / "sft"
    base = ("trainer.save_freq=1", "optim.lr_warmup_steps=0", "optim.warmup_style=constant")
    SFTTrainer(_sft_config(tiny_model_dir, tiny_data, out, 1, *base, "optim.lr=0.001")).fit()
    again = SFTTrainer(_sft_config(tiny_model_dir, tiny_data, out, 2, *base, "optim.lr=0.002"))
    assert again.step == 1
    assert again.optimizer.param_groups[0]["lr"] == pytest.approx(0.002)
    assert "optim.lr: 0.001 → 0.002 (applied" in capsys.readouterr().err


def test_router_lr_change_applies(tiny_model_dir, tiny_data, tmp_path):
    """Pins: the router head's own SGD kept the checkpoint's learning rate."""
    out = tmp_path / "router"
    extra = {"router.enable": "true", "router.freeze_lm": "true", "trainer.save_freq": 1}
    Trainer(grpo_config(tiny_model_dir, tiny_data, out, 1, **extra, **{"router.lr": 1.0})).fit()
    again = Trainer(grpo_config(tiny_model_dir, tiny_data, out, 2, **extra, **{"router.lr": 0.25}))
    assert again.step == 1
    assert again.router.policy.optimizer.param_groups[0]["lr"] == 0.25
