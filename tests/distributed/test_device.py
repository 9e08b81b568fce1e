"""``trainer.device`` (issue #21): the pieces that place work on it. Before the key existed the
batch had no ``to``, ``load_policy`` no ``device`` and ``auto`` dtype ignored GPUs."""

from __future__ import annotations

import torch

from toolgrpo.config.schema import ModelConfig
from toolgrpo.models.loading import compute_dtype, load_policy
from toolgrpo.trainer.batch import collate_rows


def test_auto_dtype_is_bf16_on_a_gpu_device():
    assert compute_dtype("auto", torch.device("cuda", 0)) == torch.bfloat16
    assert compute_dtype("float32", torch.device("cuda", 0)) == torch.float32


def test_batch_moves_every_tensor_and_keeps_lists():
    b = collate_rows([([1, 2], [3], [1], [-0.5]), ([4], [5, 6], [1, 0], [-1.0, 0.0])], "ab", 0)
    b.advantages_BR = torch.ones(2, 2)
    moved = b.to(torch.device("meta"))
    assert moved.input_ids_BT.device.type == "meta"
    assert moved.advantages_BR.device.type == "meta"
    assert moved.uids == ["a", "b"] and b.input_ids_BT.device.type == "cpu"


def test_policy_lives_and_autocasts_on_its_device(tiny_model_dir):
    policy = load_policy(
        ModelConfig(path=str(tiny_model_dir), dtype="bfloat16"), trainable=False, device="cpu"
    )
    assert policy.device == torch.device("cpu")
    assert all(p.device.type == "cpu" for p in policy.model.parameters())
    with policy.autocast():
        assert torch.is_autocast_enabled("cpu")
