"""Gradient clipping refuses values that flip or erase the update (issue 15, item 5).

torch scales gradients by ``max_norm / norm`` (capped at 1): before this fix ``grad_clip=-1``
turned every update into gradient ascent (cosine about -1 with the ``grad_clip=1`` update) and
``grad_clip=0`` zeroed it. Config validation refuses them (tests/config/test_rules.py); these
tests pin the second line of defence where clipping is applied, for a config that skipped it.
"""

from __future__ import annotations

import zlib

import pytest
import torch

from toolgrpo.models.loading import trainable_parameters
from toolgrpo.rewards.scoring import Score
from toolgrpo.trainer import rollout_stage as trainer_mod
from toolgrpo.trainer.optim import clip_grad_norm
from toolgrpo.trainer.trainer import Trainer


def _varied_score(task, text, step, flags):
    v = float(zlib.crc32(text.encode()) % 7) - 3.0
    return Score(v, 0.0, v, 0.0, False, False)


def _update(make_train_config, tmp_path, clip) -> torch.Tensor:
    """The parameter change of one step with ``grad_clip=clip`` set after validation."""
    cfg = make_train_config(
        steps=1,
        out=tmp_path / f"clip{clip}",
        **{
            "actor_rollout_ref.actor.optim.lr": 1e-3,
            "actor_rollout_ref.actor.optim.weight_decay": 0.0,
            "trainer.save_hf_model": "false",
        },
    )
    t = Trainer(cfg)
    t.cfg.actor_rollout_ref.actor.grad_clip = clip  # as if validation had been skipped
    params = trainable_parameters(t.policy.model)
    before = torch.cat([p.detach().flatten().clone() for p in params])
    t.train_step(1)
    return torch.cat([p.detach().flatten() for p in params]) - before


def test_negative_or_zero_grad_clip_never_reaches_the_optimizer(
    make_train_config, tmp_path, monkeypatch
):
    monkeypatch.setattr(trainer_mod, "score", _varied_score)
    reference = _update(make_train_config, tmp_path, 1.0)
    assert reference.norm() > 0
    for bad in (-1.0, 0.0, float("nan")):
        try:
            delta = _update(make_train_config, tmp_path, bad)
        except ValueError as e:
            assert "grad_clip" in str(e)
            continue
        cos = float(torch.nn.functional.cosine_similarity(reference, delta, dim=0))
        pytest.fail(
            f"grad_clip={bad} was applied: update norm {float(delta.norm()):.3g}, cosine with "
            f"the grad_clip=1 update {cos:.5f}"
        )


def test_grad_clip_null_means_no_clipping(make_train_config, tmp_path, monkeypatch):
    monkeypatch.setattr(trainer_mod, "score", _varied_score)
    unclipped = _update(make_train_config, tmp_path, None)
    huge = _update(make_train_config, tmp_path, 1e9)
    torch.testing.assert_close(unclipped, huge)
    clipped = _update(make_train_config, tmp_path, 1e-3)
    assert float(torch.nn.functional.cosine_similarity(unclipped, clipped, dim=0)) > 0.9


def test_clip_grad_norm_helper():
    p = torch.nn.Parameter(torch.ones(4))
    p.grad = torch.full((4,), 3.0)  # norm 6
    for bad in (-1.0, 0.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="grad_clip"):
            clip_grad_norm([p], bad)
    assert float(clip_grad_norm([p], None)) == pytest.approx(6.0)
    assert torch.equal(p.grad, torch.full((4,), 3.0))
    assert float(clip_grad_norm([p], 3.0)) == pytest.approx(6.0)
    assert p.grad.norm() == pytest.approx(3.0, rel=1e-4)
