"""benchmarks/roofline.py: FLOP and byte counts against hand computations on a tiny config and
against torch's FLOP counter on the product's own shared-prefix forward + backward; the bound
arithmetic; and one ``--tiny`` run end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

from roofline_lib import (  # noqa: E402
    LINEARS,
    ModelShape,
    attention_flops_per_pair,
    body_params,
    bucket_widths,
    causal_pairs,
    cpu_flags,
    decode_bound,
    decode_bytes_per_step,
    decode_flops_per_token,
    flat_tokens,
    group_lengths,
    head_params,
    kv_bytes_per_token,
    lora_params,
    main_job_reference,
    markdown_rows,
    parse_groups,
    response_mask,
    scored_tokens,
    shared_prefix_tokens,
    table_rows,
    update_flops,
)

# hidden 64, intermediate 128, 2 layers, 4 heads of 16, 2 KV heads, vocab 100
TINY = ModelShape(
    hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2, head_dim=16, vocab=100
)
N_BODY = 2 * (64 * 64 + 64 * 32 + 64 * 32 + 64 * 64 + 3 * 64 * 128)  # q, k, v, o, gate/up/down
N_HEAD = 64 * 100
PAIR = 4 * 4 * 16 * 2  # q·k and p·v, 4 heads of 16, 2 layers


def _llama(vocab: int = 100):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )


def test_shape_and_parameter_counts_by_hand_and_from_a_real_model():
    from transformers import LlamaForCausalLM

    cfg = _llama()
    assert ModelShape.from_config(cfg) == TINY
    assert body_params(TINY) == N_BODY == 73_728
    assert head_params(TINY) == N_HEAD
    model = LlamaForCausalLM(cfg)
    linear = sum(
        m.weight.numel() for m in model.get_decoder().modules() if isinstance(m, torch.nn.Linear)
    )
    assert linear == N_BODY
    assert model.get_output_embeddings().weight.numel() == N_HEAD


def test_lora_parameters_by_hand_and_as_peft_makes_them():
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    # r=2 on q (64 -> 64) and v (64 -> 32): 2 layers x (2*(64+64) + 2*(64+32))
    assert lora_params(TINY, 2, ["q_proj", "v_proj"]) == 2 * (256 + 192) == 896
    peft = get_peft_model(LlamaForCausalLM(_llama()), LoraConfig(r=4, target_modules=list(LINEARS)))
    trainable = sum(p.numel() for p in peft.parameters() if p.requires_grad)
    assert lora_params(TINY, 4, LINEARS) == trainable
    with pytest.raises(ValueError, match="unknown LoRA targets"):
        lora_params(TINY, 4, ["qkv_proj"])


def test_causal_pairs_and_attention_cost():
    assert causal_pairs(0, 3) == 1 + 2 + 3
    assert causal_pairs(5, 2) == 6 + 7  # positions 5 and 6 see 6 and 7 keys
    assert causal_pairs(7, 0) == 0
    assert attention_flops_per_pair(TINY) == PAIR == 512
    assert kv_bytes_per_token(TINY, 4) == 2 * 2 * 2 * 16 * 4  # K and V, layers, kv heads, fp32


def test_shared_prefix_costs_p_plus_n_r_tokens_not_n_times_p_plus_r():
    assert shared_prefix_tokens(420, [640, 60, 80, 100]) == 420 + 880
    assert flat_tokens(420, [640, 60, 80, 100]) == 4 * (420 + 640)


def test_update_flops_by_hand():
    """Prompt 3, responses of 2 and 1 tokens, 896 LoRA weights: the backbone runs 3 + 1 + 0
    tokens, the LM head 3 positions; pairs 1+2+3 (prompt) + 4 (response 0's first token)."""
    got = update_flops(TINY, 3, [2, 1], 896)
    assert (got["backbone_tokens"], got["head_positions"], got["attention_pairs"]) == (4, 3, 10)
    assert got["forward_body"] == got["backward_body"] == 2 * N_BODY * 4
    assert got["forward_lora"] == 2 * 896 * 4 and got["backward_lora"] == 4 * 896 * 4
    assert got["forward_head"] == got["backward_head"] == 2 * N_HEAD * 3
    assert got["backward_attention"] == 2 * got["forward_attention"] == 2 * PAIR * 10
    assert got["total"] == (4 * N_BODY + 6 * 896) * 4 + 4 * N_HEAD * 3 + 3 * PAIR * 10 == 1_293_312
    both = update_flops(TINY, 3, [2, 1], 896, recompute_head=True, recompute_body=True)
    extra = 2 * N_HEAD * 3 + 2 * (N_BODY + 896) * 4 + PAIR * 10
    assert both["total"] == got["total"] + extra


def test_bucket_widths_pad_each_bucket_to_its_longest_row():
    from toolgrpo.models.logprobs import length_buckets

    lengths = [640, 60, 80, 100]
    assert length_buckets(lengths) == [[0], [3, 2, 1]]
    assert bucket_widths(lengths, [[0], [3, 2, 1]]) == [640, 100, 100, 100]


def test_update_counts_match_torchs_flop_counter_on_the_products_forward_backward():
    """Matmul FLOPs of ``shared_prefix_logprobs`` + backward on a LoRA model, as torch counts
    them: the executed count (buckets padded, LM head recomputed) minus attention (not an mm)
    and minus layer 0's q/k/v input gradient, which autograd skips (frozen embeddings)."""
    from peft import LoraConfig, get_peft_model
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import LlamaForCausalLM

    from toolgrpo.models.attention import register
    from toolgrpo.models.logprobs import length_buckets, shared_prefix_logprobs

    torch.manual_seed(0)
    base = LlamaForCausalLM(_llama(500))
    base.config._attn_implementation = register()
    rank = 4
    model = get_peft_model(base, LoraConfig(r=rank, target_modules=list(LINEARS)))
    shape = ModelShape.from_config(base.config)
    n_lora = sum(p.numel() for p in model.parameters() if p.requires_grad)
    prompt, lengths = 30, [20, 5, 6, 7]
    prompt_ids = torch.randint(0, 500, (prompt,))
    response_ids = torch.randint(0, 500, (4, max(lengths)))
    with FlopCounterMode(display=False) as forward:
        out = shared_prefix_logprobs(
            model.get_base_model(), prompt_ids, response_ids, response_lengths=lengths
        )
    with FlopCounterMode(display=False) as backward:
        out.logprobs_BR.sum().backward()
    mm = torch.ops.aten.mm
    counted = {
        "forward": forward.get_flop_counts()["Global"][mm],
        "backward": backward.get_flop_counts()["Global"][mm],
    }
    got = update_flops(shape, prompt, bucket_widths(lengths, length_buckets(lengths)), n_lora, True)
    assert counted["forward"] == got["forward_body"] + got["forward_lora"] + got["forward_head"]
    qkv = 64 * 64 + 2 * 64 * 32
    skipped = 2 * (qkv + 3 * rank * 64) * got["backbone_tokens"]
    expected_backward = (
        got["backward_body"] + got["backward_lora"] + got["backward_head"] + got["recompute_head"]
    )
    assert counted["backward"] == expected_backward - skipped


def test_decode_counts_by_hand():
    assert decode_flops_per_token(TINY, 10) == 2 * (N_BODY + N_HEAD) + PAIR * 10
    weights = (N_BODY + N_HEAD) * 4
    assert decode_bytes_per_step(TINY, 3, 10, 4, 4) == weights + 3 * 10 * 512
    assert decode_bytes_per_step(TINY, 3, 10, 4, 2) == weights + 3 * 10 * 256  # bf16 KV


def test_decode_bound_takes_the_slower_roof_per_step():
    """One decode step (new_tokens=2) at context 9+1 for 3 rows: compute takes 1 s, memory 2 s."""
    flops = 3 * decode_flops_per_token(TINY, 10)
    nbytes = decode_bytes_per_step(TINY, 3, 10, 4, 4)
    b = decode_bound(TINY, 3, 9, 2, peak_flops=flops, bandwidth=nbytes / 2, weight_bytes=4)
    assert b["tok_s"] == pytest.approx(1.5) and b["memory_tok_s"] == pytest.approx(1.5)
    assert b["compute_tok_s"] == pytest.approx(3.0) and b["limiter"] == "memory"
    weights_s = (N_BODY + N_HEAD) * 4 / (nbytes / 2)
    assert b["tok_s_weights_only"] == pytest.approx(3 / weights_s)
    assert b["flops_per_token_mean"] == flops / 3 and b["context_mean"] == 10
    # Two steps (contexts 10 and 11): time is the sum of each step's slower roof.
    two = decode_bound(TINY, 3, 9, 3, peak_flops=1e9, bandwidth=1e12, weight_bytes=4)
    t = (3 * decode_flops_per_token(TINY, 10) + 3 * decode_flops_per_token(TINY, 11)) / 1e9
    assert two["tok_s"] == pytest.approx(6 / t) and two["limiter"] == "compute"


def test_group_lengths_cycle_the_pattern_and_scale():
    assert group_lengths([[4, 2], [3]], groups=2, n=2) == [[4, 2], [3, 4]]
    assert group_lengths([[40, 10]], groups=1, n=3, scale=0.1) == [[4, 2, 4]]  # at least 2
    assert parse_groups("440,60;80") == [[440, 60], [80]]
    for bad in ("", "1,0", ";"):
        with pytest.raises(ValueError):
            parse_groups(bad)


def test_cpu_flags_and_main_job_reference():
    info = "processor\t: 0\nflags\t\t: fpu sse avx2 fma avx512f amx_bf16\nflags : avx512_bf16\n"
    assert cpu_flags(info) == ["avx2", "fma", "avx512f", "amx_bf16"]  # the first flags line
    lines = [
        json.dumps({"step": 0, "val/x": 1}),
        json.dumps({"step": 1, "timing/train_s": 80.0, "prompt_length/mean": 350.0}),
        json.dumps({"step": 2, "timing/train_s": 60.0, "prompt_length/mean": 370.0}),
        json.dumps({"step": 3, "timing/train_s": 70.0, "prompt_length/mean": 360.0}),
    ]
    ref = main_job_reference(lines)
    assert ref["steps"] == 3 and ref["timing/train_s"] == 70.0
    assert ref["prompt_length/mean"] == 360.0


def _record() -> dict:
    gemm = {"gflops": 80.0, "best_shape": [2048, 576, 1536], "shapes": [{}, {}]}
    bound = {
        "tok_s": 400.0,
        "limiter": "memory",
        "bytes_per_step_mean": 1.2e9,
        "weight_bytes_per_step": 5.4e8,
        "context_mean": 408.0,
        "flops_per_token_mean": 3e8,
    }
    return {
        "peaks": {
            "gemm": {"float32": {"1": gemm, "2": gemm}},
            "bandwidth": {"2": {"mb": 512, "copy_gbs": 10.0, "read_gbs": 12.0, "gbs": 12.0}},
        },
        "generation": {
            "batch": 32,
            "backend": "vllm",
            "dtype": "float32",
            "threads": 2,
            "decode_tok_s": 200.0,
            "bound": bound,
            "fraction": 0.5,
        },
        "update": {
            "dtype": "float32",
            "threads": 2,
            "gflops_model": 60.0,
            "peak_gflops": 120.0,
            "fraction_model": 0.5,
            "fraction_executed": 0.6,
            "flops_model": 3e12,
            "seconds": 50.0,
            "groups": 8,
            "n": 4,
            "tokens_shared_prefix": 6750,
            "tokens_flat": 16000,
        },
    }


def test_table_and_markdown_rows():
    rows = table_rows(_record())
    assert len(rows) == 2 + 1 + 2 and all(len(r) == 5 for r in rows)
    assert rows[0][0] == "GEMM peak, float32, 1 thread" and rows[1][0].endswith("2 threads")
    gen, upd = rows[3], rows[4]
    assert gen[1:4] == ("200.0 tok/s", "400.0 tok/s (memory)", "50%")
    assert upd[1:4] == ("60.0 GFLOP/s", "120.0 GFLOP/s (GEMM peak)", "50%")
    md = markdown_rows(_record())
    assert md[0] == "| quantity | measured | bound | fraction | basis |" and len(md) == 2 + 5
    assert all(line.startswith("| ") or line.startswith("|---") for line in md)


def test_tiny_run_end_to_end(tmp_path):
    """The script on a tiny random model (HF backend, 1 thread): it writes a coherent JSON."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    cmd = [
        sys.executable,
        str(REPO / "benchmarks" / "roofline.py"),
        "--tiny",
        "--peak-threads",
        "1",
        "--repeats",
        "1",
        "--bandwidth-mb",
        "16",
        "--gen-repeats",
        "1",
        "--update-repeats",
        "1",
        "--results",
        str(tmp_path),
        "--markdown",
        "actor_rollout_ref.rollout.name=hf",
    ]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| generation: decode at batch 32" in done.stdout
    rec = json.loads((tmp_path / "roofline_tiny.json").read_text())
    assert set(rec["peaks"]["gemm"]) == {"float32", "bfloat16"}
    assert set(rec["peaks"]["gemm"]["float32"]) == {"1"}
    assert rec["peaks"]["bandwidth"]["1"]["gbs"] > 0
    g = rec["generation"]
    assert g["backend"] == "hf" and g["batch"] == 32 and g["threads"] == 1
    assert g["decode_tokens"] == 32 * (g["new_tokens"] - 1)  # EOS ignored: every row decodes
    assert 0 < g["fraction"] == pytest.approx(g["decode_tok_s"] / g["bound"]["tok_s"])
    u = rec["update"]
    shape = ModelShape(**rec["shape"])
    assert u["trainable_params"] == rec["counts"]["lora_params_from_config"]
    share = u["tool_share"]
    model = sum(
        update_flops(
            shape,
            u["prompt_tokens"],
            lens,
            u["trainable_params"],
            scored=[scored_tokens(r, share) for r in lens],
        )["total"]
        for lens in u["response_lengths"]
    )
    assert u["flops_model"] == model < u["flops_executed"]
    assert u["fraction_model"] == pytest.approx(
        u["flops_model"] / u["seconds"] / 1e9 / u["peak_gflops"]
    )
    assert rec["targets"]["update_fraction"] == 0.5
    assert len(rec["machine"]["load_avg_start"]) == 3 and "load_avg_end" in rec["machine"]


def test_tool_output_masks_and_scored_counts():
    """A multi-turn row: the model's call, tool output (mask 0), the model's answer; the LM
    head is counted only at the model's tokens."""
    assert response_mask(10, 0.6) == [1, 1, 0, 0, 0, 0, 0, 0, 1, 1]
    assert scored_tokens(10, 0.6) == 4 and scored_tokens(3, 0.99) == 1
    assert response_mask(5, 0.0) == [1] * 5
    s = ModelShape(layers=2, hidden=8, intermediate=16, heads=2, kv_heads=1, head_dim=4, vocab=50)
    full = update_flops(s, 6, [10, 4], 0)
    part = update_flops(s, 6, [10, 4], 0, scored=[4, 2])
    assert full["head_positions"] == 14 and part["head_positions"] == 6
    assert full["forward_body"] == part["forward_body"]
    assert full["forward_head"] - part["forward_head"] == 2 * head_params(s) * 8
