"""Users' environments: ``--import``, ``trainer.imports`` and ``toolgrpo.envs`` entry points
(``toolgrpo.envs.plugins``), with the example package in examples/toolgrpo_env_example."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from tests.conftest import read_metrics, train_overrides, write_jsonl
from toolgrpo.envs import plugins, registry

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "toolgrpo_env_example"
MT = "actor_rollout_ref.rollout.multi_turn.enable"


@pytest.fixture(autouse=True)
def clean_registry(monkeypatch):
    """Each test sees the entry points afresh and leaves no plugin module or env type behind
    (built-in types it imports stay registered, as their modules stay imported)."""
    registry._REGISTRY.pop("reverse_word", None)
    monkeypatch.setattr(plugins, "_entry_points_loaded", False)
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if name.startswith(("toolgrpo_env_example", "my_reverse_env", "broken_env")):
            del sys.modules[name]
    registry._REGISTRY.pop("reverse_word", None)


def plugin_file(tmp_path: Path, name: str = "my_reverse_env.py") -> Path:
    """The example's env module as a loose .py file (what a user's script would be)."""
    path = tmp_path / "plugins" / name
    path.parent.mkdir(exist_ok=True)
    shutil.copy(EXAMPLE / "toolgrpo_env_example" / "reverse.py", path)
    return path


def fake_install(tmp_path: Path, entry: str = "toolgrpo_env_example.reverse") -> None:
    """What ``pip install examples/toolgrpo_env_example`` leaves: the package and a dist-info
    folder whose entry_points.txt declares the plugin, on sys.path."""
    site = tmp_path / "site"
    shutil.copytree(EXAMPLE / "toolgrpo_env_example", site / "toolgrpo_env_example")
    info = site / "toolgrpo_env_example-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toolgrpo-env-example\n")
    (info / "entry_points.txt").write_text(f"[toolgrpo.envs]\nreverse_word = {entry}\n")
    sys.path.insert(0, str(site))


def test_a_py_file_registers_its_env_and_is_recorded_absolute(tmp_path, monkeypatch):
    path = plugin_file(tmp_path)
    monkeypatch.chdir(path.parent)
    from toolgrpo.config.loader import load_config
    from toolgrpo.config.schema import TrainConfig

    cfg = load_config(TrainConfig, None, [])
    plugins.load_run_plugins(cfg, [path.name])
    assert cfg.trainer.imports == [str(path)]  # what Ray workers and the saved config get
    assert "reverse_word" in registry.env_types()
    env = registry.EnvRouter({"rev": {"type": "reverse_word"}})
    assert env.spec("rev").type == "reverse_word"
    with pytest.raises(registry.EnvConfigError, match="unknown reverse_word option"):
        registry.EnvRouter({"rev": {"type": "reverse_word", "colour": 1}})


def test_the_example_env_plays_an_episode(tmp_path):
    """The factory on its own: reset offers the tool, step runs it, reward checks the answer."""
    import asyncio

    from toolgrpo.data.loader import row_to_task
    from toolgrpo.envs.base import Transcript
    from toolgrpo.tools.types import ToolCall

    path = plugin_file(tmp_path)
    plugins.load_plugins([str(path)])
    from my_reverse_env import make_rows

    task = row_to_task(make_rows(["grpo"])[0], "rev.jsonl", 0)
    env = registry.EnvRouter().make(task)

    async def play():
        start = await env.reset()
        (result,) = await env.step([ToolCall("reverse", {"text": "grpo"})])
        said = [*start.messages, {"role": "assistant", "content": "<answer>oprg</answer>"}]
        return start, result, await env.reward(Transcript(said, "", "answer", 2))

    start, result, reward = asyncio.run(play())
    assert [t["function"]["name"] for t in start.tools] == ["reverse"]
    assert result.text == "oprg" and not result.is_error
    assert reward.score == 1.0


def test_the_entry_point_makes_the_env_available(tmp_path):
    fake_install(tmp_path)
    assert "reverse_word" not in registry._REGISTRY
    registry.get_env_factory("reverse_word")  # an unknown name looks at the entry points
    assert "toolgrpo_env_example.reverse" in sys.modules
    assert plugins.load_entry_points() == []  # once per process


def test_an_installed_type_plays_its_own_task_type_unconfigured(tmp_path):
    fake_install(tmp_path)
    assert registry.EnvRouter().spec("reverse_word") == registry.EnvSpec("reverse_word", 4)
    with pytest.raises(registry.EnvConfigError, match="no environment for task_type 'nope'"):
        registry.EnvRouter().spec("nope")


def test_a_broken_entry_point_is_one_line_naming_it(tmp_path):
    fake_install(tmp_path, entry="toolgrpo_env_example.missing")
    with pytest.raises(plugins.PluginError) as e:
        plugins.load_plugins()
    text = str(e.value)
    assert "\n" not in text and "'reverse_word'" in text
    assert "toolgrpo_env_example.missing" in text and "toolgrpo-env-example" in text


@pytest.mark.parametrize(
    ("ref", "needle"),
    [
        ("no_such_env_module_xyz", "ModuleNotFoundError"),
        ("missing_env.py", "no such file"),
        ("broken_env.py", "ZeroDivisionError"),
    ],
)
def test_a_bad_import_stops_train_with_one_line(ref, needle, tiny_model_dir, tmp_path, capsys):
    from toolgrpo.cli import main

    (tmp_path / "broken_env.py").write_text("x = 1 / 0\n")
    over = train_overrides(tiny_model_dir, tmp_path / "none.jsonl", tmp_path / "out", 1)
    assert main(["train", *over, "--import", str(tmp_path / ref) if ".py" in ref else ref]) == 2
    err = capsys.readouterr().err
    (line,) = err.strip().splitlines()
    assert line.startswith("toolgrpo train: error: ")
    assert ref in line and needle in line and "Traceback" not in err


def test_a_plugin_that_exits_at_import_is_named(tiny_model_dir, tmp_path, capsys):
    """Was: a plugin parsing ``sys.argv`` at import printed its own usage and exited, and
    nothing named the plugin."""
    from toolgrpo.cli import main

    argv_env = tmp_path / "argv_env.py"
    argv_env.write_text(
        "import argparse\np = argparse.ArgumentParser()\np.add_argument('--port')\np.parse_args()\n"
    )
    over = train_overrides(tiny_model_dir, tmp_path / "none.jsonl", tmp_path / "out", 1)
    assert main(["train", *over, "--import", str(argv_env)]) == 2
    err = capsys.readouterr().err
    line = [x for x in err.splitlines() if x.startswith("toolgrpo train: error: ")]
    assert len(line) == 1 and "Traceback" not in err, err
    assert str(argv_env) in line[0] and "called sys.exit(2) while being imported" in line[0]


def test_train_plays_an_imported_env(tiny_model_dir, tmp_path):
    """``toolgrpo train ... --import my_reverse_env.py``: episodes of the user's env type."""
    from toolgrpo.cli import main

    sys.path.insert(0, str(EXAMPLE))
    from toolgrpo_env_example.reverse import make_rows

    data = write_jsonl(tmp_path / "rev.jsonl", make_rows(["abc", "tool", "grpo", "plug"]))
    out = tmp_path / "out"
    over = train_overrides(tiny_model_dir, data, out, 1, **{MT: "true"})
    assert main(["train", *over, "--import", str(plugin_file(tmp_path))]) == 0
    (rec,) = read_metrics(out)
    assert rec["episode/reverse_word/turns/mean"] >= 1.0
    assert rec["rollout/env_failures"] == 0.0
    saved = (out / "config.yaml").read_text()
    assert "my_reverse_env.py" in saved  # a resume or a Ray worker imports it again


def test_a_rollout_worker_imports_the_runs_plugins(tmp_path, monkeypatch):
    """Ray workers are fresh processes: ``RolloutWorker`` imports ``trainer.imports`` first."""
    import toolgrpo.models.loading as loading
    from toolgrpo.config.loader import load_config
    from toolgrpo.config.schema import TrainConfig
    from toolgrpo.distributed.worker import RolloutWorker

    class Loaded(Exception):
        pass

    def stop(*args, **kwargs):
        raise Loaded

    monkeypatch.setattr(loading, "load_policy", stop)  # the model is not the point here
    path = plugin_file(tmp_path)
    cfg = load_config(TrainConfig, None, [f"trainer.imports=[{path}]"])
    assert "reverse_word" not in registry._REGISTRY
    with pytest.raises(Loaded):
        RolloutWorker(cfg, 0)
    assert "reverse_word" in registry._REGISTRY
