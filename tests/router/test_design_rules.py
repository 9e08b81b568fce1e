"""The design's literal router rules stay one config away: the YAML block docs/router.md shows
for them loads verbatim, trains, and steps λ by plain projected dual ascent."""

from __future__ import annotations

import re
import zlib
from pathlib import Path

import pytest

from tests.conftest import read_metrics, train_overrides
from toolgrpo.config.loader import load_config
from toolgrpo.config.schema import TrainConfig
from toolgrpo.rewards.scoring import Score
from toolgrpo.trainer import rollout_stage as stage_mod
from toolgrpo.trainer.trainer import Trainer

DOC = Path(__file__).resolve().parents[2] / "docs" / "router.md"


def _literal_yaml() -> str:
    text = DOC.read_text()
    after = text.split("The design's literal rules, as a config", 1)[1]
    return re.search(r"```yaml\n(.*?)```", after, re.S).group(1)


def test_the_designs_literal_rules_train_verbatim(tiny_model_dir, tiny_data, tmp_path, monkeypatch):
    def varied(task, text, step, flags):
        v = float(zlib.crc32(text.encode()) % 7) - 3.0
        return Score(v, 0.0, v, 0.0, False, False)

    monkeypatch.setattr(stage_mod, "score", varied)
    path = tmp_path / "design.yaml"
    path.write_text(_literal_yaml())
    out = tmp_path / "run"
    cfg = load_config(TrainConfig, str(path), train_overrides(tiny_model_dir, tiny_data, out, 2))
    rc = cfg.router
    assert (rc.lagrangian, rc.dual_kp, rc.entropy_coeff) == ("reward", 0.0, 0.01)
    assert (rc.family_tools_only, rc.head_ema) == (False, 0.0)
    Trainer(cfg).fit()
    first, second = read_metrics(out)
    # plain ascent from λ = 0: λ_2 = max(0, η·(cost_1 − B))
    want = max(0.0, rc.dual_lr * (first["router/cost/mean"] - rc.budget))
    assert second["router/lambda"] == pytest.approx(want, abs=1e-6)
