"""The example env package, really installed (``pip install examples/toolgrpo_env_example``, into
a folder of its own), trains 2 steps in a fresh ``toolgrpo train`` process: found through its
``toolgrpo.envs`` entry point with no flag, and named with ``--import``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import read_metrics, train_overrides, write_jsonl
from toolgrpo.envs import registry

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "toolgrpo_env_example"


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The example package installed by pip (no deps, no network: the venv's setuptools)."""
    target = tmp_path_factory.mktemp("site")
    work = tmp_path_factory.mktemp("build")
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation"]
    source = work / "toolgrpo_env_example"  # pip builds in the source folder: a copy of it
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    cmd += ["--target", str(target), str(source)]
    r = subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (target / "toolgrpo_env_example" / "reverse.py").is_file()
    (info,) = target.glob("toolgrpo_env_example-*.dist-info")
    assert "reverse_word" in (info / "entry_points.txt").read_text()
    return target


def train(site: Path, tiny_model_dir: Path, tmp_path: Path, *flags: str) -> list[dict]:
    """``toolgrpo train`` for 2 steps on reverse_word tasks, the package on the path only."""
    before = set(sys.modules)
    sys.path.insert(0, str(EXAMPLE))
    try:
        from toolgrpo_env_example.reverse import make_rows
    finally:  # this process keeps no trace: other tests import the package themselves
        sys.path.remove(str(EXAMPLE))
        for name in set(sys.modules) - before:
            if name.startswith("toolgrpo_env_example"):
                del sys.modules[name]
        registry._REGISTRY.pop("reverse_word", None)
    data = write_jsonl(tmp_path / "rev.jsonl", make_rows(["abc", "tool", "grpo", "plug"]))
    out = tmp_path / "out"
    over = train_overrides(
        tiny_model_dir,
        data,
        out,
        2,
        **{
            "actor_rollout_ref.rollout.multi_turn.enable": "true",
            "actor_rollout_ref.rollout.name": "hf",
        },
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT / "src")])}
    env["OMP_NUM_THREADS"] = "1"
    cmd = [sys.executable, "-m", "toolgrpo.cli", "train", *over, *flags]
    r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return read_metrics(out)


def test_the_installed_package_trains_through_its_entry_point(site, tiny_model_dir, tmp_path):
    records = train(site, tiny_model_dir, tmp_path)
    assert [r["step"] for r in records] == [1, 2]
    for rec in records:
        assert rec["episode/reverse_word/turns/mean"] >= 1.0
        assert rec["rollout/env_failures"] == 0.0


def test_the_installed_package_trains_through_import(site, tiny_model_dir, tmp_path):
    records = train(site, tiny_model_dir, tmp_path, "--import", "toolgrpo_env_example.reverse")
    assert [r["step"] for r in records] == [1, 2]
    assert all(r["episode/reverse_word/turns/mean"] >= 1.0 for r in records)
    saved = (tmp_path / "out" / "config.yaml").read_text()
    assert "toolgrpo_env_example.reverse" in saved  # a resume or a Ray worker imports it again


def test_without_the_package_the_task_type_is_one_clear_error(tiny_model_dir, tmp_path):
    """The same run with the package not installed stops with one line naming the task type."""
    empty = tmp_path / "empty_site"
    empty.mkdir()
    with pytest.raises(AssertionError, match="reverse_word"):
        train(empty, tiny_model_dir, tmp_path)
