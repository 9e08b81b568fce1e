"""Startup errors of the sharded update (issue #21): each misfit between the config, the launch
and the machine is one clear error before any model loads. Before the feature the keys did not
exist, so each of these configs was refused as unknown instead."""

from __future__ import annotations

import pytest
import torch

from toolgrpo.config.loader import ConfigError
from toolgrpo.distributed import fsdp
from toolgrpo.distributed.fsdp import DistributedSetupError, resolve_device, start_ranks
from toolgrpo.errors import UserError


def test_world_size_that_does_not_divide_the_groups(make_train_config, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    cfg = make_train_config(
        **{
            "trainer.distributed.strategy": "fsdp2",
            "trainer.device": "cpu",
            "data.train_batch_size": 3,
            "actor_rollout_ref.actor.ppo_mini_batch_size": 3,
        }
    )
    with pytest.raises(DistributedSetupError, match="multiples of the world size"):
        start_ranks(cfg)


def test_missing_backend(make_train_config, monkeypatch):
    monkeypatch.setattr(fsdp.dist, "is_gloo_available", lambda: False)
    cfg = make_train_config(**{"trainer.distributed.strategy": "fsdp2", "trainer.device": "cpu"})
    with pytest.raises(DistributedSetupError, match="needs the gloo backend"):
        start_ranks(cfg)


def test_nnodes_times_ranks_per_node_must_match_the_launch(make_train_config, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    cfg = make_train_config(
        **{"trainer.distributed.strategy": "fsdp2", "trainer.n_gpus_per_node": 4}
    )
    with pytest.raises(DistributedSetupError, match="torchrun started 2 processes"):
        start_ranks(cfg)


def test_several_processes_without_a_strategy(make_train_config, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(DistributedSetupError, match="strategy=none"):
        start_ranks(make_train_config())


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_asked_for_without_cuda(make_train_config):
    assert issubclass(DistributedSetupError, UserError)  # the CLI prints one line, exits 2
    with pytest.raises(DistributedSetupError, match="CUDA is not available"):
        start_ranks(make_train_config(**{"trainer.device": "cuda"}))
    with pytest.raises(DistributedSetupError, match="CUDA is not available"):
        resolve_device("cuda:1")


def test_device_auto_is_cpu_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")


def test_bad_device_name_is_a_config_error(make_train_config):
    from toolgrpo.config.validate import validate_train_config

    with pytest.raises(ConfigError, match="trainer.device must be"):
        validate_train_config(make_train_config(**{"trainer.device": "gpu"}))


def test_features_outside_the_sharded_passes_are_refused(make_train_config):
    from toolgrpo.distributed.fsdp import check_strategy

    fsdp2 = {"trainer.distributed.strategy": "fsdp2"}
    check_strategy(make_train_config(**fsdp2, **{"algorithm.adv_estimator": "gae"}))  # it runs
    check_strategy(make_train_config(**fsdp2, **{"async_training.enable": "true"}))  # it runs
    cfg = make_train_config(**fsdp2, **{"router.enable": "true", "router.lr": "null"})
    with pytest.raises(ConfigError, match="does not support router.lr=null"):
        check_strategy(cfg)
