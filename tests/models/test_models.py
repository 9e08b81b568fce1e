"""Model resolution and loading on the tiny model: full fine-tuning, LoRA, saving and reloading."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from toolgrpo.config.schema import ModelConfig
from toolgrpo.models.loading import (
    ModelLoadError,
    Policy,
    compute_dtype,
    load_policy,
    load_tokenizer,
    save_hf_model,
    trainable_parameters,
)
from toolgrpo.models.registry import ADAPTER_DIR, ALIASES, ModelNotFound, resolve_model


def _ids(policy: Policy) -> torch.Tensor:
    ids = policy.tokenizer("the quick brown fox calls a tool", return_tensors="pt").input_ids
    return ids


def _logits(model, ids) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


def test_tiny_model_loads(tiny_model_dir):
    policy = load_policy(ModelConfig(path=str(tiny_model_dir), dtype="float32"))
    assert not policy.is_lora
    assert policy.dtype == torch.float32
    assert policy.resolved.hf_dir == tiny_model_dir
    assert policy.base is policy.model
    assert policy.tokenizer.chat_template
    assert policy.tokenizer.pad_token_id is not None
    assert all(p.dtype == torch.float32 for p in policy.model.parameters())
    params = trainable_parameters(policy.model)
    assert len(params) == len(list(policy.model.parameters()))  # full fine-tuning
    logits = _logits(policy.model, _ids(policy))
    assert logits.shape[-1] == policy.model.config.vocab_size
    assert torch.isfinite(logits).all()


def test_frozen_load(tiny_model_dir):
    policy = load_policy(ModelConfig(path=str(tiny_model_dir), dtype="float32"), trainable=False)
    assert not policy.model.training
    assert trainable_parameters(policy.model) == []


def test_resolve_missing_path(tmp_path):
    with pytest.raises(ModelNotFound) as ei:
        resolve_model(str(tmp_path / "does-not-exist"))
    assert "does-not-exist" in str(ei.value)
    assert "not downloaded" in str(ei.value) or "nothing is downloaded" in str(ei.value)


def test_resolve_dir_without_config(tmp_path):
    d = tmp_path / "empty_model"
    d.mkdir()
    with pytest.raises(ModelNotFound, match="no config.json"):
        resolve_model(str(d))


def test_resolve_unknown_alias_says_nothing_is_downloaded():
    with pytest.raises(ModelNotFound) as ei:
        resolve_model("smollm3-no-such-alias")
    msg = str(ei.value)
    assert "smollm3-no-such-alias" in msg
    assert "downloaded" in msg
    assert "smollm2-135m" in msg  # lists the known aliases


def test_resolve_missing_gguf(tmp_path):
    with pytest.raises(ModelNotFound, match="GGUF file not found"):
        resolve_model(str(tmp_path / "m.gguf"))


def test_model_not_found_is_file_not_found():
    assert issubclass(ModelNotFound, FileNotFoundError)


def test_compute_dtype():
    assert compute_dtype("auto") in (torch.bfloat16, torch.float32)
    assert compute_dtype("float32") == torch.float32
    assert compute_dtype("bfloat16") == torch.bfloat16
    with pytest.raises(ValueError, match="unknown dtype"):
        compute_dtype("int8")


def test_load_tokenizer_without_chat_template_is_refused(tiny_model_dir, tmp_path):
    tok = load_tokenizer(tiny_model_dir)
    tok.chat_template = None
    tok.save_pretrained(tmp_path)
    (tmp_path / "chat_template.jinja").unlink(missing_ok=True)
    cfg_file = tmp_path / "tokenizer_config.json"
    cfg = json.loads(cfg_file.read_text())
    cfg.pop("chat_template", None)
    cfg_file.write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="chat template"):
        load_tokenizer(tmp_path)


def _lora_policy(tiny_model_dir, **kw) -> Policy:
    return load_policy(ModelConfig(path=str(tiny_model_dir), dtype="float32", lora_rank=4, **kw))


def test_lora_only_lora_params_trainable(tiny_model_dir):
    policy = _lora_policy(tiny_model_dir)
    assert policy.is_lora
    named = dict(policy.model.named_parameters())
    trainable = {n for n, p in named.items() if p.requires_grad}
    assert trainable, "LoRA must leave something to train"
    assert all("lora_" in n for n in trainable), sorted(trainable)
    assert all(not p.requires_grad for n, p in named.items() if "lora_" not in n)
    assert all(named[n].dtype == torch.float32 for n in trainable)
    # all-linear: every projection of every layer got an adapter (lm_head excluded by PEFT)
    n_layers = policy.base.config.num_hidden_layers
    assert sum("lora_A" in n for n in trainable) == 7 * n_layers
    assert policy.base is not policy.model


def test_lora_target_modules_list(tiny_model_dir):
    policy = _lora_policy(tiny_model_dir, target_modules="q_proj, v_proj")
    trainable = [n for n, p in policy.model.named_parameters() if p.requires_grad]
    assert trainable and all(("q_proj" in n or "v_proj" in n) for n in trainable)


def _train_one_step(policy: Policy, ids: torch.Tensor) -> None:
    policy.model.train()
    opt = torch.optim.AdamW(trainable_parameters(policy.model), lr=1e-2)
    loss = policy.model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad()


def test_lora_save_load_round_trip(tiny_model_dir, tmp_path):
    torch.manual_seed(0)
    policy = _lora_policy(tiny_model_dir)
    ids = _ids(policy)
    with policy.model.disable_adapter():
        base_logits = _logits(policy.model, ids)
    before = _logits(policy.model, ids)
    torch.testing.assert_close(before, base_logits)  # LoRA B starts at zero
    _train_one_step(policy, ids)
    lora_b = [p for n, p in policy.model.named_parameters() if "lora_B" in n]
    assert any(p.abs().sum() > 0 for p in lora_b)
    trained = _logits(policy.model, ids)
    assert not torch.allclose(trained, base_logits, atol=1e-4)

    adapter = tmp_path / "adapter"
    policy.model.save_pretrained(adapter)
    assert (adapter / "adapter_config.json").is_file()

    reloaded = load_policy(
        ModelConfig(path=str(tiny_model_dir), dtype="float32", adapter_path=str(adapter)),
        trainable=False,
    )
    assert reloaded.is_lora
    torch.testing.assert_close(_logits(reloaded.model, ids), trained, rtol=0, atol=1e-6)

    # A bare adapter directory resolves its base through adapter_config.json.
    resolved = resolve_model(str(adapter))
    assert resolved.adapter_dir == adapter
    assert resolved.hf_dir == tiny_model_dir


def test_lora_rank_that_contradicts_the_adapter_is_refused(tiny_model_dir, tmp_path):
    """A shipped or given adapter is what trains; a different lora_rank would be ignored
    silently, so it is an error (its own rank, or 0, is accepted)."""
    adapter = tmp_path / "adapter"
    _lora_policy(tiny_model_dir).model.save_pretrained(adapter)  # rank 4
    cfg = {"path": str(tiny_model_dir), "dtype": "float32", "adapter_path": str(adapter)}
    with pytest.raises(ModelLoadError, match="lora_rank=8 .* rank-4 LoRA adapter"):
        load_policy(ModelConfig(**cfg, lora_rank=8))
    for rank in (0, 4):
        assert load_policy(ModelConfig(**cfg, lora_rank=rank)).is_lora


def test_missing_adapter_path(tiny_model_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match="adapter"):
        load_policy(
            ModelConfig(path=str(tiny_model_dir), dtype="float32", adapter_path=str(tmp_path))
        )


def test_save_hf_model_merges_lora(tiny_model_dir, tmp_path):
    torch.manual_seed(0)
    policy = _lora_policy(tiny_model_dir)
    ids = _ids(policy)
    _train_one_step(policy, ids)
    lora_logits = _logits(policy.model, ids)
    out = tmp_path / "merged"
    save_hf_model(policy, out)
    assert (out / "config.json").is_file()
    assert not (out / "adapter_config.json").exists()  # a plain model, not an adapter
    merged = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    torch.testing.assert_close(_logits(merged, ids), lora_logits, rtol=1e-4, atol=1e-4)
    # The live policy is still a LoRA model (merging happened on a copy).
    assert policy.is_lora and any("lora_" in n for n, _ in policy.model.named_parameters())
    torch.testing.assert_close(_logits(policy.model, ids), lora_logits)
    # and the tokenizer travels with it
    assert load_tokenizer(out).chat_template


def test_save_hf_model_full(tiny_model_dir, tmp_path):
    policy = load_policy(ModelConfig(path=str(tiny_model_dir), dtype="float32"))
    ids = _ids(policy)
    save_hf_model(policy, tmp_path / "full")
    again = AutoModelForCausalLM.from_pretrained(str(tmp_path / "full"), dtype=torch.float32)
    torch.testing.assert_close(_logits(again, ids), _logits(policy.model, ids))


@pytest.mark.parametrize("alias", [a for a, spec in ALIASES.items() if spec.adapter])
def test_shipped_adapters_are_whole_and_have_provenance(alias):
    """Every alias that names a shipped adapter finds it in the package, with the record of how
    it was made (command, data hash, steps, loss, evals)."""
    d = ADAPTER_DIR / ALIASES[alias].adapter
    assert (d / "adapter_config.json").is_file() and (d / "adapter_model.safetensors").is_file()
    prov = json.loads((d / "PROVENANCE.json").read_text())
    assert prov["command"] and prov["steps"] > 0 and len(prov["data_hash_sha256"]) == 64
    assert prov["eval_rlla_test"]["num_tasks"] == 80
