"""A second tiny model for the mixture tests: same tokenizer as the actor, other weights."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_fixed_dir(tmp_path_factory) -> Path:
    from toolgrpo.models.tiny import build_tiny_model_dir

    return build_tiny_model_dir(tmp_path_factory.mktemp("tiny_fixed") / "model", seed=1)
