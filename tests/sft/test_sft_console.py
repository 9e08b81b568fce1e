"""``toolgrpo sft`` has ``toolgrpo train``'s console and plugins: libraries' logs and Python
warnings go to <output_dir>/run.log, off a quiet console unless ``trainer.verbose``, ``-v`` or
TOOLGRPO_LOG_LEVEL asks; ``--import MODULE`` and ``trainer.imports`` load users' modules first."""

from __future__ import annotations

import logging
import sys
import warnings

import pytest
import yaml

from toolgrpo import run_log
from toolgrpo.cli import main
from toolgrpo.envs import registry
from toolgrpo.sft import trainer as sft_trainer
from toolgrpo.sft.config import SFTConfig
from toolgrpo.sft.trainer import SFTTrainer

FOREIGN = ("FOREIGN-TRANSFORMERS", "FOREIGN-VLLM", "FOREIGN-PYWARNING")
PLUGIN = "toolgrpo_sft_probe_plugin"
ENV = "sft_probe_env"


def _overrides(model, data, out) -> list[str]:
    return [
        f"model.path={model}",
        "model.dtype=float32",
        f"data.train_files=[{data}]",
        "data.max_length=4096",
        "data.train_batch_size=2",
        "trainer.total_training_steps=1",
        "trainer.save_freq=-1",
        "trainer.logger=[console,jsonl]",
        f"trainer.output_dir={out}",
    ]


@pytest.fixture
def chatty(monkeypatch):
    """Loading the model logs what libraries log while a run is under way: INFO, a warning of
    a library with its own stderr handler, and a Python warning."""
    real = sft_trainer.load_policy

    def load(*args, **kwargs):
        logging.getLogger("transformers.modeling_utils").warning(FOREIGN[0])
        logging.getLogger("vllm.config").info(FOREIGN[1])
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.warn(FOREIGN[2], FutureWarning, stacklevel=1)
        return real(*args, **kwargs)

    monkeypatch.setattr(sft_trainer, "load_policy", load)
    monkeypatch.delenv(run_log.LEVEL_ENV, raising=False)


def test_sft_keeps_library_lines_off_the_console_and_in_run_log(
    chatty, tiny_model_dir, tiny_data, tmp_path, capsys
):
    """Pins: sft wrote no run.log and left every library line on the console."""
    out = tmp_path / "sft"
    root = logging.getLogger()
    handlers = list(root.handlers)
    assert main(["sft", *_overrides(tiny_model_dir, tiny_data, out)]) == 0
    seen = capsys.readouterr()
    console = seen.out + seen.err
    assert not [f for f in FOREIGN if f in console], console
    assert f"library logs: {out / 'run.log'}" in console  # where they went, said at start
    assert "step 1" in console  # toolgrpo's own lines stay
    text = (out / "run.log").read_text()
    assert all(f in text for f in FOREIGN), text
    assert root.handlers == handlers  # the run log is closed with the run


@pytest.mark.parametrize("how", ["trainer.verbose", "-v", "TOOLGRPO_LOG_LEVEL"])
def test_verbose_puts_library_lines_back_on_the_console(
    how, chatty, tiny_model_dir, tiny_data, tmp_path, capsys, monkeypatch
):
    out = tmp_path / "sft"
    args = ["sft", *_overrides(tiny_model_dir, tiny_data, out)]
    if how == "trainer.verbose":
        args.append("trainer.verbose=true")
    elif how == "-v":
        args.insert(0, "-v")
    else:
        monkeypatch.setenv(run_log.LEVEL_ENV, "INFO")
    assert main(args) == 0
    console = capsys.readouterr().err
    assert all(f in console for f in FOREIGN), console
    assert all(f in (out / "run.log").read_text() for f in FOREIGN)


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """A user's .py module that registers an environment type; forgotten afterwards."""
    path = tmp_path / "plugins" / f"{PLUGIN}.py"
    path.parent.mkdir()
    path.write_text(
        "from toolgrpo.envs.registry import register_env\n\n\n"
        f"@register_env({ENV!r})\n"
        "def make(**options):\n"
        "    raise NotImplementedError\n"
    )
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield path
    registry._REGISTRY.pop(ENV, None)
    sys.modules.pop(PLUGIN, None)


@pytest.mark.parametrize("where", ["before", "after"])
def test_sft_import_loads_the_module_and_records_it(
    where, plugin, tiny_model_dir, tiny_data, tmp_path
):
    """Pins: ``toolgrpo sft --import`` was an unknown option (or an override)."""
    out = tmp_path / "sft"
    over = _overrides(tiny_model_dir, tiny_data, out)
    imp = ["--import", str(plugin)]
    args = ["sft", *imp, *over] if where == "before" else ["sft", *over, *imp]
    assert main(args) == 0
    assert ENV in registry.env_types()
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["trainer"]["imports"] == [str(plugin.resolve())]


def test_trainer_imports_is_honoured_by_the_library(plugin, tiny_model_dir, tiny_data, tmp_path):
    from toolgrpo.config.loader import load_config

    over = _overrides(tiny_model_dir, tiny_data, tmp_path / "sft")
    cfg = load_config(SFTConfig, None, [*over, f"trainer.imports=[{plugin}]"])
    trainer = SFTTrainer(cfg)
    try:
        assert ENV in registry.env_types()
        assert cfg.trainer.imports == [str(plugin.resolve())]
    finally:
        trainer.close()


def test_a_bad_import_is_one_line_before_the_model_loads(
    tiny_model_dir, tiny_data, tmp_path, capsys, monkeypatch
):
    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the plugin was imported")

    monkeypatch.setattr(sft_trainer, "load_policy", refuse)
    missing = tmp_path / "nowhere.py"
    args = ["sft", *_overrides(tiny_model_dir, tiny_data, tmp_path / "sft"), "--import", missing]
    assert main([str(a) for a in args]) == 2
    err = capsys.readouterr().err
    lines = [s for s in err.splitlines() if s.startswith("toolgrpo sft: error:")]
    assert "Traceback" not in err and len(lines) == 1 and "nowhere.py" in lines[0], err
