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
