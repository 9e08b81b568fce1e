"""The command line a user gets wrong or cuts short: Ctrl-C, a prompt that is an override,
``--help`` that hid every option, no ``--version``; a vLLM context longer than the model's; a
calculator literal whose upper-case exponent slipped past the size filter."""

from __future__ import annotations

import time

import pytest

from tests.probes.conftest import one_error_line
from toolgrpo.cli import main
from toolgrpo.config.loader import load_config, valid_keys
from toolgrpo.config.schema import TrainConfig
from toolgrpo.trainer.checkpoint import write_checkpoint


def _fake_trainer(monkeypatch, fit):
    class Trainer:
        def __init__(self, cfg):
            self.cfg = cfg

        def fit(self):
            return fit(self.cfg)

        def close(self):
            pass

    monkeypatch.setattr("toolgrpo.trainer.trainer.Trainer", Trainer)


def test_ctrl_c_says_how_to_resume(monkeypatch, tmp_path, capsys):
    """Pins: SIGINT printed a raw KeyboardInterrupt traceback."""

    def interrupted(cfg):
        write_checkpoint(cfg.trainer.output_dir, 3, {"global_step": 3}, lambda d: None)
        raise KeyboardInterrupt

    _fake_trainer(monkeypatch, interrupted)
    assert main(["train", f"trainer.output_dir={tmp_path}"]) == 130
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert f"interrupted; run the same command again to resume from {tmp_path}" in err
    assert "global_step_3" in err


def test_ctrl_c_before_any_checkpoint(monkeypatch, tmp_path, capsys):
    def interrupted(cfg):
        raise KeyboardInterrupt

    _fake_trainer(monkeypatch, interrupted)
    assert main(["train", f"trainer.output_dir={tmp_path}"]) == 130
    assert "no checkpoint in" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args", [["trainer.num_threads=1"], ["configs/x.yaml", "data.max_prompt_length=64"]]
)
def test_infer_refuses_an_override_as_the_prompt(args, monkeypatch, capsys):
    """Pins: ``toolgrpo infer trainer.num_threads=1`` played an episode whose prompt was the
    override."""

    def played(*a, **k):
        raise AssertionError("an episode was played")

    monkeypatch.setattr("toolgrpo.infer.run_infer", played)
    assert main(["infer", *args]) == 2
    line = one_error_line(capsys.readouterr().err, "infer")
    assert "looks like a config override" in line and "PROMPT" in line


def test_infer_prompt_with_an_equals_sign_still_plays(monkeypatch):
    seen = {}
    monkeypatch.setattr("toolgrpo.infer.run_infer", lambda *a, **k: seen.setdefault("p", a[2]))
    assert main(["infer", "if x=3, what is 2x?"]) == 0
    assert seen["p"] == "if x=3, what is 2x?"


@pytest.mark.parametrize("command", ["train", "sft", "eval", "infer"])
def test_every_subcommand_help_lists_its_options(command, capsys):
    """Pins: ``train --help`` showed only ``rest``."""
    with pytest.raises(SystemExit) as done:
        main([command, "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "[config.yaml] [key=value ...]" in out and " rest" not in out
    assert f"toolgrpo {command} --keys" in out and "sections: " in out


def test_keys_lists_every_config_key(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--keys"])
    listed = {ln.split(" = ")[0] for ln in capsys.readouterr().out.splitlines()}
    assert "data.train_batch_size" in listed and "trainer.output_dir" in listed
    assert listed <= valid_keys(TrainConfig)


def test_version(capsys):
    from toolgrpo import __version__

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == f"toolgrpo {__version__}"


def test_vllm_context_beyond_the_model_is_one_line_before_the_engine(monkeypatch, tiny_model_dir):
    """Pins: rollout.name=auto with max_prompt_length + max_response_length over the model's
    context raised vLLM's pydantic ValidationError traceback from the engine."""
    from transformers import AutoConfig

    from toolgrpo.config.loader import ConfigError
    from toolgrpo.rollout import backends

    monkeypatch.setattr(backends, "vllm_available", lambda: True)
    monkeypatch.setattr(backends, "vllm_unsupported", lambda *a, **k: None)
    monkeypatch.delenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", raising=False)

    class Policy:
        base = type("Base", (), {"config": AutoConfig.from_pretrained(tiny_model_dir)})()

    over = ["data.max_prompt_length=4000", "data.max_response_length=200"]
    cfg = load_config(TrainConfig, None, over)  # the tiny model's context is 4096
    with pytest.raises(
        ConfigError, match=r"4000 \+ 200 = 4200 exceeds the model's context of 4096"
    ):
        backends.make_generator(cfg, Policy())
    cfg = load_config(TrainConfig, None, ["actor_rollout_ref.rollout.max_model_len=5000"])
    with pytest.raises(ConfigError, match="rollout.max_model_len=5000 exceeds"):
        backends.make_generator(cfg, Policy())


def test_rope_scaling_stretches_the_context():
    from types import SimpleNamespace

    from toolgrpo.rollout.backends import model_context

    plain = SimpleNamespace(max_position_embeddings=2048)
    linear = SimpleNamespace(
        max_position_embeddings=2048, rope_scaling={"type": "linear", "factor": 4}
    )
    llama3 = SimpleNamespace(
        max_position_embeddings=8192, rope_scaling={"rope_type": "llama3", "factor": 8}
    )
    assert [model_context(c) for c in (plain, linear, llama3)] == [2048, 8192, 8192]
    assert model_context(SimpleNamespace()) is None


# Literals sympy reads as 10**999999: building one exactly takes minutes.
HOSTILE_EQUATIONS = ["x = 1E999999", "x = 1e+999999", "x = 2.5E+99999", "x = 3E-99999"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("equation", HOSTILE_EQUATIONS)
def test_solve_refuses_huge_exponents_in_any_case(equation):
    """Pins: ``solve("x = 1E999999")`` (upper-case E) passed the exponent filter."""
    from toolgrpo.envs.calculator import solve

    t0 = time.monotonic()
    with pytest.raises(ValueError, match="out of range"):
        solve(equation)
    assert time.monotonic() - t0 < 5


def test_solve_still_reads_exponents_and_euler():
    from toolgrpo.envs.calculator import solve

    assert solve("x = 2.5E3") == "x = 2500"
    assert solve("x = 1e+2") == "x = 100"
    assert solve("2E*x = 1").startswith("x = exp(-1)/2")
