"""Which live vLLM engine a generator may share (``engine_key``), and the clear refusal of a
second in-process engine on CPU. No vLLM needed: keys are computed from files and a tokenizer."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from toolgrpo.config.loader import ConfigError
from toolgrpo.models.loading import load_tokenizer
from toolgrpo.rollout import vllm_backend
from toolgrpo.rollout.vllm_backend import engine_key

ARGS = {"dtype": "float32", "max_model_len": 1024, "enforce_eager": True}


def _args(model_dir, **over) -> dict:
    return {**ARGS, "model": str(model_dir), "tokenizer": str(model_dir), **over}


def _copy(src, dst, **config_changes):
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg.update(config_changes)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def test_a_saved_copy_of_the_same_model_shares_the_key(tiny_model_dir, tmp_path):
    """Path, name and version/dtype stamps do not matter: weights are pushed anyway."""
    tok = load_tokenizer(tiny_model_dir)
    copy = _copy(
        tiny_model_dir,
        tmp_path / "ckpt" / "model",
        _name_or_path="elsewhere",
        transformers_version="0.0.1",
        torch_dtype="bfloat16",
    )
    assert engine_key(_args(copy), tok) == engine_key(_args(tiny_model_dir), tok)


def test_shape_settings_or_tokenizer_change_the_key(tiny_model_dir, tmp_path):
    tok = load_tokenizer(tiny_model_dir)
    base = engine_key(_args(tiny_model_dir), tok)
    wider = _copy(tiny_model_dir, tmp_path / "wider", num_hidden_layers=3)
    assert engine_key(_args(wider), tok) != base
    assert engine_key(_args(tiny_model_dir, max_model_len=2048), tok) != base
    tok.add_tokens(["<extra_token>"])
    assert engine_key(_args(tiny_model_dir), tok) != base


def test_a_second_engine_on_cpu_is_a_clear_error(tiny_model_dir, tmp_path, monkeypatch):
    """Two in-process engines share vLLM's process-wide parallel state (closing one broke the
    other, tests/vllm/test_vllm_compat.py): refuse before vLLM is called."""
    tok = load_tokenizer(tiny_model_dir)
    live = engine_key(_args(tiny_model_dir), tok)
    monkeypatch.setattr(vllm_backend, "_ENGINES", {live: object()})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    other = _copy(tiny_model_dir, tmp_path / "other", num_hidden_layers=3)
    with pytest.raises(ConfigError, match="model shape.*rollout.name=hf"):
        vllm_backend._engine_for(_args(other), engine_key(_args(other), tok))
    with pytest.raises(ConfigError, match="engine settings"):
        args = _args(tiny_model_dir, max_model_len=2048)
        vllm_backend._engine_for(args, engine_key(args, tok))
