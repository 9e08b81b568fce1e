"""Choosing the backend and mapping the config to engine arguments (no engine started here)."""

from __future__ import annotations

import importlib.util
import os

import pytest

from toolgrpo.config.loader import ConfigError, load_config
from toolgrpo.config.schema import TrainConfig
from toolgrpo.models.loading import cpu_has_native_bf16
from toolgrpo.rollout import backends
from toolgrpo.rollout.vllm_backend import engine_args, set_engine_env

pytestmark = pytest.mark.vllm

ENV_KEYS = (
    "VLLM_ENABLE_V1_MULTIPROCESSING",
    "VLLM_NO_USAGE_STATS",
    "DO_NOT_TRACK",
    "TORCHDYNAMO_DISABLE",
    "VLLM_CPU_OMP_THREADS_BIND",
)


def _cfg(**kv: str) -> TrainConfig:
    return load_config(TrainConfig, None, [f"{k}={v}" for k, v in kv.items()])


def test_vllm_without_vllm_installed_is_a_config_error(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a)
    )
    with pytest.raises(ConfigError, match="rollout.name=vllm but vllm is not installed"):
        backends.backend_name(_cfg(**{"actor_rollout_ref.rollout.name": "vllm"}))
    assert backends.backend_name(_cfg(**{"actor_rollout_ref.rollout.name": "auto"})) == "hf"


def test_engine_args_follow_the_config():
    r = "actor_rollout_ref.rollout"
    cfg = _cfg(**{"data.max_prompt_length": "300", "data.max_response_length": "20"})
    args = engine_args(cfg, "/m", on_gpu=False)
    assert args["max_model_len"] == 320  # 0 = prompt + response
    assert args["dtype"] == ("bfloat16" if cpu_has_native_bf16() else "float32")
    assert args["logprobs_mode"] == "processed_logprobs"
    assert args["kv_cache_memory_bytes"] == 2**30 and "gpu_memory_utilization" not in args
    assert args["enable_chunked_prefill"] is False and args["max_num_batched_tokens"] >= 320
    gpu = engine_args(_cfg(**{f"{r}.max_model_len": "64"}), "/m", on_gpu=True)
    assert gpu["dtype"] == "bfloat16" and gpu["max_model_len"] == 64
    assert gpu["gpu_memory_utilization"] == 0.5 and "kv_cache_memory_bytes" not in gpu
    with pytest.raises(ValueError, match="tensor_model_parallel_size"):
        engine_args(_cfg(**{f"{r}.tensor_model_parallel_size": "2"}), "/m", on_gpu=False)


def test_engine_env_defaults_never_override_the_user(monkeypatch):
    for k in ENV_KEYS:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0-1")
    set_engine_env(_cfg(), on_gpu=False)
    assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert "TORCHDYNAMO_DISABLE" not in os.environ  # only while an eager engine starts
