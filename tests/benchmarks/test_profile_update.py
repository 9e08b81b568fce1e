"""benchmarks/profile_update.py: the categoriser on hand-made ops, the summary's arithmetic, the
walk over the profiler's event tree (self times, autocast redispatch), and the categories of
a real profile of a small LoRA + attention + LM-head step (torch's op names as this torch
records them)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

from profile_update import (  # noqa: E402
    ATTN,
    BASE,
    CATEGORIES,
    ELEM,
    FUSED,
    HEAD,
    LORA,
    OPTIM,
    OTHER,
    PYTHON,
    Op,
    categorise,
    profiled_ops,
    summarise,
    tree_ops,
)

V, R = 49_152, 16  # SmolLM2's vocabulary, the shipped adapter's rank
H, INTER = 576, 1536


@pytest.mark.parametrize(
    ("op", "category"),
    [
        (Op("aten::mm", 1.0, ((704, H), (H, INTER))), BASE),
        (Op("aten::addmm", 1.0, ((INTER,), (704, H), (H, INTER))), BASE),  # bias first
        (Op("aten::mm", 1.0, ((704, H), (H, R)), ("aten::matmul", "aten::linear")), LORA),
        (Op("aten::mm", 1.0, ((R, 704), (704, H))), LORA),  # LoRA A's weight gradient
        (Op("aten::mm", 1.0, ((64, H), (H, V))), HEAD),
        (Op("aten::mm", 1.0, ((64, V), (V, H)), ("MmBackward0",)), HEAD),
        (Op("aten::addmm", 1.0, ((H,), (704, R), (R, H))), LORA),
        (Op("aten::logsumexp", 1.0, ((1, 64, V), (), ())), HEAD),
        (Op("aten::exp", 1.0, ((1, 64, 10),), ("LogsumexpBackward0",)), HEAD),
        (Op("aten::scatter_add_", 1.0, (), ("GatherBackward0",)), HEAD),
        (Op("aten::_to_copy", 1.0, ((1, 64, V), (), ())), HEAD),  # the logits' .float()
        (Op("aten::embedding", 1.0, ((V, H), (4, 360))), OTHER),  # not the head
        (Op("aten::_scaled_dot_product_flash_attention_for_cpu", 1.0), ATTN),
        (
            Op(
                "aten::bmm", 1.0, ((9, 64, 64), (9, 64, R)), ("aten::scaled_dot_product_attention",)
            ),
            ATTN,
        ),
        (Op("aten::zeros", 1.0, (), ("ScaledDotProductFlashAttentionForCpuBackward0",)), ATTN),
        (Op("aten::mul", 1.0, ((704, H), (704, H))), ELEM),
        (Op("aten::silu", 1.0, ((704, INTER),)), ELEM),
        (Op("aten::_to_copy", 1.0, ((H, R), (), ())), ELEM),  # autocast's cast of a LoRA weight
        (Op("aten::lerp_", 1.0, ((R, H), (R, H), ()), ("Optimizer.step#AdamW.step",)), OPTIM),
        (Op("aten::_foreach_norm", 1.0), OPTIM),  # the grad clip
        (Op("## Call CompiledFxGraph fi4xsykaoiweqsm5 ##", 1.0), FUSED),  # use_torch_compile
        (Op("aten::mm", 1.0, ((704, H), (H, INTER)), ("## Call CompiledFxGraph f ##",)), BASE),
        (Op("TorchDynamo Cache Lookup", 1.0), OTHER),
        (Op("aten::view", 1.0, ((704, H), ())), OTHER),
        (Op("autograd::engine::evaluate_function: MmBackward0", 1.0), OTHER),
    ],
)
def test_categorise(op, category):
    assert categorise(op, V, R) == category


def test_no_lora_rank_means_no_lora_category():
    assert categorise(Op("aten::mm", 1.0, ((704, H), (H, R))), V, 0) == BASE


def test_summarise_shares_python_and_top_ops():
    ops = [
        Op("aten::mm", 3.0, ((704, H), (H, INTER))),
        Op("aten::mm", 1.0, ((704, H), (H, R))),
        Op("aten::mm", 0.5, ((704, H), (H, R)), (), 2),
        Op("aten::mul", 1.5, ((4, 4), (4, 4))),
        Op("aten::view", 0.5),
    ]
    out = summarise(ops, 10.0, V, R, k=3)
    secs = {r["category"]: r["seconds"] for r in out["categories"]}
    assert [r["category"] for r in out["categories"]] == list(CATEGORIES)
    assert secs[BASE] == 3.0 and secs[LORA] == 1.5 and secs[ELEM] == 1.5 and secs[OTHER] == 0.5
    assert secs[PYTHON] == pytest.approx(10.0 - 6.5) and out["ops_self_s"] == 6.5
    assert sum(r["share"] for r in out["categories"]) == pytest.approx(1.0)
    assert out["events"] == 5 and out["ops_self_s_by_thread"] == {"0": 6.0, "2": 0.5}
    top = [(t["name"], t["category"], t["calls"]) for t in out["top_ops"]]
    assert top == [("aten::mm", BASE, 1), ("aten::mm", LORA, 2), ("aten::mul", ELEM, 1)]
    lora = next(r for r in out["categories"] if r["category"] == LORA)
    assert lora["top_ops"] == [{"name": "aten::mm", "seconds": 1.5}]
    # ops outlasting the wall (several threads): no negative Python time
    assert summarise(ops, 5.0, V, R)["categories"][-1]["seconds"] == 0.0


def _ev(name, ns, children=(), sizes=None, tid=1):
    inputs = [SimpleNamespace(sizes=s) for s in (sizes or [])] + [3]
    return SimpleNamespace(
        name=name,
        duration_time_ns=ns,
        children=list(children),
        extra_fields=SimpleNamespace(inputs=inputs),
        start_tid=tid,
    )


def test_tree_ops_self_times_parents_and_redispatch():
    mm = _ev("aten::mm", 300, sizes=[[4, 8], [8, 16]])
    inner = _ev("aten::linear", 350, [_ev("aten::t", 20), mm])
    outer = _ev("aten::linear", 400, [inner], sizes=[[4, 8], [16, 8]])  # autocast: twice
    root = _ev("aten::add", 50)
    ops = list(tree_ops([outer, root]))
    assert [o.name for o in ops] == ["aten::linear", "aten::t", "aten::mm", "aten::add"]
    lin, t, m, add = ops
    assert lin.self_s == pytest.approx(80e-9) and lin.shapes == ((4, 8), (16, 8), ())
    assert t.parents == ("aten::linear",) and m.parents == ("aten::linear",)
    assert m.self_s == pytest.approx(300e-9) and m.shapes == ((4, 8), (8, 16), ())
    assert add.parents == () and add.thread == 1
    assert sum(o.self_s for o in ops) == pytest.approx(450e-9)  # the roots' durations


def test_real_profile_of_a_small_lora_attention_head_step():
    """Names and shapes as this torch's profiler records them land in the intended categories
    (hidden 8, output 12, rank 4, vocabulary 50, 6 tokens: no dimension shared)."""
    from torch.profiler import ProfilerActivity, profile

    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 8, generator=g)
    w = torch.randn(12, 8, generator=g)
    a = torch.nn.Parameter(torch.randn(4, 8, generator=g))
    b = torch.nn.Parameter(torch.zeros(12, 4))
    head = torch.randn(50, 8, generator=g)
    opt = torch.optim.AdamW([a, b], lr=1e-3)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        h = F.linear(x, w) + F.linear(F.linear(x, a), b)
        q = k = v = h.view(1, 2, 6, 6)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True).reshape(6, 12)
        hid = F.linear(att[:, :8], torch.eye(8))
        logits = F.linear(hid, head)
        lp = logits.gather(-1, torch.arange(6)[:, None]).squeeze(-1) - logits.logsumexp(-1)
        lp.sum().backward()
        opt.step()
    ops = list(profiled_ops(prof))
    cats: dict[str, set[str]] = {}
    for op in ops:
        cats.setdefault(categorise(op, 50, 4), set()).add(op.name)
    assert "aten::mm" in cats[LORA] and "aten::mm" in cats[HEAD] and "aten::mm" in cats[BASE]
    assert any("scaled_dot_product" in n for n in cats[ATTN])
    assert "aten::logsumexp" in cats[HEAD] and "aten::gather" in cats[HEAD]
    assert any(n.startswith("Optimizer.step") for n in cats[OPTIM])
    assert "aten::add" in cats[ELEM]
    total = summarise(ops, 1.0, 50, 4)["ops_self_s"]
    assert total == pytest.approx(sum(e.self_cpu_time_total for e in prof.events()) / 1e6)
