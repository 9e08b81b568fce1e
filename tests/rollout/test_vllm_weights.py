"""Weights for an engine in another process (``rollout.mode=async``) go through one safetensors
file: every tensor arrives exactly, and a tied LM head is written once, under the embedding's
name, as a checkpoint has it (the engine re-ties it after the reload)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from transformers import LlamaConfig, LlamaForCausalLM

from toolgrpo.rollout.vllm_weights import actor_weights, save_weights


def _model(tied: bool) -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=tied,
    )
    return LlamaForCausalLM(cfg)


@pytest.mark.parametrize("tied", [True, False])
def test_saved_weights_round_trip_and_a_tied_head_is_written_once(tmp_path, tied):
    model = _model(tied)
    path = str(tmp_path / "model.safetensors")
    written = save_weights(actor_weights(model), path)
    got = load_file(path)
    want = model.state_dict()
    expected = set(want) - ({"lm_head.weight"} if tied else set())
    assert set(got) == expected and written == len(expected)
    for k in expected:
        assert torch.equal(got[k], want[k]), k


def test_reload_pushes_in_the_engine_dtype():
    """An fp32 actor into a bf16 engine: tensors arrive as bf16 (vLLM warned once per weight,
    60 lines per push), integer buffers untouched."""
    from types import SimpleNamespace

    from toolgrpo.rollout.vllm_weights import reload_into_worker

    got: dict[str, torch.dtype] = {}

    def reload_weights(weights_iterator, is_checkpoint_format):
        got.update({name: t.dtype for name, t in weights_iterator})

    worker = SimpleNamespace(
        model_config=SimpleNamespace(dtype=torch.bfloat16),
        reload_weights=reload_weights,
        model_runner=SimpleNamespace(model=SimpleNamespace(config=SimpleNamespace())),
    )
    weights = [("w", torch.ones(2)), ("ids", torch.arange(3)), ("b", torch.ones(1).bfloat16())]
    reload_into_worker(worker, iter(weights))
    assert got == {"w": torch.bfloat16, "ids": torch.int64, "b": torch.bfloat16}
