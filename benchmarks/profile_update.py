"""Where one actor update's time goes beyond the GEMMs: ``torch.profiler`` self CPU time of the
main job's update, by category (issue #19, item 4).

Run by hand (SmolLM2: about 3 minutes on a quiet 2-core CPU: a warm-up and a profiled update of
~50 s each, then a walk over ~1M profiler events; the profile holds ~3 GB while it runs):

    python benchmarks/profile_update.py                  # configs/agent_smollm2_grpo.yaml
    python benchmarks/profile_update.py --dtype float32  # fp32 (auto: bf16 where native)
    python benchmarks/profile_update.py --tiny           # tiny random model, seconds

The batch and actor are roofline.py's update measure (roofline_measure.update_inputs: 8 groups of
4, prompt ``--prompt`` tokens, responses ``--responses`` of which ``--tool-share`` is tool output
with response_mask 0; the trainer's own ``Actor.update``). One warm-up update, then one under
``torch.profiler`` (CPU, shapes recorded, no stacks). Each op's self CPU time goes to one
category: GEMMs split by their operands' shapes (a dimension equal to the vocabulary: the LM
head; else one equal to the LoRA rank: LoRA's small matmuls; else the frozen base), attention
(SDPA forward and backward and everything under them), the rest of the chunked LM head
(logsumexp, gather and their backward), elementwise ops and norms, the optimizer (AdamW and the
grad clip's foreach ops) and autograd / other (views, allocation, the autograd engine). Python
overhead is the update's wall time minus all ops' self time. The profiler adds a little to each op,
so shares are of the profiled update's wall time; the warm-up's unprofiled time is also recorded.

Nothing is downloaded (HF_HUB_OFFLINE=1). Writes benchmarks/results/profile_update.json
(``--tiny``: profile_update_tiny.json; ``--results DIR`` elsewhere) and prints one table.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
from roofline_measure import (  # noqa: E402
    RESPONSES,
    TOOL_SHARE,
    load_cfg,
    machine,
    update_groups,
    update_inputs,
)

CONFIG = REPO / "configs" / "agent_smollm2_grpo.yaml"
BASE, LORA, HEAD, ATTN = "base GEMMs", "LoRA matmuls", "LM head", "attention"
ELEM, OPTIM, OTHER, PYTHON = "elementwise & norms", "optimizer", "autograd / other", "Python"
FUSED = "compiled (fused) kernels"
CATEGORIES = (BASE, LORA, HEAD, ATTN, ELEM, FUSED, OPTIM, OTHER, PYTHON)
DETAIL = {
    BASE: "mm/addmm/linear on the frozen projections",
    LORA: "matmuls with a dimension equal to the LoRA rank",
    HEAD: "head GEMM (a vocabulary dimension), logsumexp, gather, their backward",
    ATTN: "scaled_dot_product_attention forward + backward",
    ELEM: "RMSNorm, SiLU, rotary, add/mul, copies and casts, reductions, loss",
    FUSED: "inductor's kernels under use_torch_compile (norms, MLP, LoRA, head statistics)",
    OPTIM: "AdamW step, zero_grad, the grad clip's foreach ops",
    OTHER: "views, allocation, autograd engine, embedding, indexing, dynamo's guards",
    PYTHON: "wall time minus all ops' self CPU time",
}
FLAG_NAMES = ("avx2", "avx512_bf16", "amx_bf16")
GEMMS = frozenset(
    "mm addmm bmm baddbmm matmul linear addmv mv dot _addmm_activation mkldnn_linear".split()
)
# Normalised (lower case, no underscores) markers found in an op's or an ancestor's name.
ATTN_MARKS = ("scaleddotproduct",)
COMPILED_GRAPH = "## Call CompiledFxGraph"  # the profiler's name for one run of inductor's code
HEAD_MARKS = ("logsumexp", "logsoftmax", "gather", "maskedscatter")
OPTIM_MARKS = ("optimizer.",)
ELEMENTWISE = frozenset(
    """add add_ sub sub_ rsub mul mul_ div div_ neg neg_ pow pow_ rsqrt sqrt exp exp_ log reciprocal
    abs sign mean sum sum_ amax amin max min clamp clamp_ clamp_min clamp_max minimum maximum
    silu silu_ silu_backward sigmoid sigmoid_backward tanh gelu gelu_backward softmax
    _softmax _softmax_backward_data cos sin where masked_fill masked_fill_ fill_ zero_ zeros
    zeros_like ones_like full full_like copy_ to _to_copy clone contiguous cat stack lerp_
    addcmul_ addcdiv_ lt le gt ge eq ne logical_not logical_and bitwise_not exponential_
    linalg_vector_norm norm rms_norm _fused_rms_norm _fused_rms_norm_backward layer_norm
    native_layer_norm native_layer_norm_backward""".split()
)


@dataclass(frozen=True)
class Op:
    """One profiler event: its name, self CPU seconds, input shapes (``()`` for a non-tensor),
    ancestors' names (innermost first) and thread."""

    name: str
    self_s: float
    shapes: tuple[tuple[int, ...], ...] = ()
    parents: tuple[str, ...] = ()
    thread: int = 0


def _norm(name: str) -> str:
    return name.lower().replace("_", "")


def _marked(op: Op, marks: tuple[str, ...]) -> bool:
    return any(m in _norm(n) for n in (op.name, *op.parents) for m in marks)


def _matrix_dims(op: Op) -> set[int]:
    """The last two dimensions of every matrix operand: a matmul's m, k and n (a bias is 1-D)."""
    return {d for s in op.shapes if len(s) >= 2 for d in s[-2:]}


def categorise(op: Op, vocab: int, rank: int) -> str:
    """The category of one op's self time. ``rank`` 0: no LoRA. An op under SDPA or the
    optimizer belongs to it whatever it is; GEMMs go by shape, others by name or ancestor."""
    short = op.name.removeprefix("aten::")
    if _marked(op, OPTIM_MARKS) or short.startswith(("_foreach_", "_fused_adam")):
        return OPTIM
    if _marked(op, ATTN_MARKS):
        return ATTN
    if op.name.startswith("aten::") and short in GEMMS:
        dims = _matrix_dims(op)
        if vocab in dims:
            return HEAD
        return LORA if rank and rank in dims else BASE
    if _marked(op, HEAD_MARKS):
        return HEAD
    first = op.shapes[0] if op.shapes else ()
    if first and first[-1] == vocab and "embedding" not in short:
        return HEAD  # the logits' own ops: the head's .float() cast, its softmax
    if op.name.startswith("aten::") and short in ELEMENTWISE:
        return ELEM
    if op.name.startswith(COMPILED_GRAPH):  # the fused code itself; GEMMs it calls stay GEMMs
        return FUSED
    return OTHER


def summarise(
    ops: Iterable[Op], wall_s: float, vocab: int, rank: int, k: int = 15
) -> dict[str, Any]:
    """One pass over ``ops``: seconds and share of ``wall_s`` per category (Python overhead: the
    time no op covers) with each category's three largest ops, and the ``k`` largest (op name,
    category) pairs by self time (aten::mm appears once per category it falls in)."""
    acc: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0])
    threads: dict[str, float] = defaultdict(float)
    for op in ops:
        a = acc[(op.name, categorise(op, vocab, rank))]
        a[0] += op.self_s
        a[1] += 1
        threads[str(op.thread)] += op.self_s
    secs: dict[str, float] = defaultdict(float)
    for (_, c), (s, _) in acc.items():
        secs[c] += s
    in_ops = sum(secs.values())
    secs[PYTHON] = max(wall_s - in_ops, 0.0)
    largest = sorted(acc.items(), key=lambda kv: -kv[1][0])

    def share(s: float) -> float:
        return s / wall_s if wall_s > 0 else 0.0

    rows = [
        {
            "category": c,
            "seconds": secs[c],
            "share": share(secs[c]),
            "top_ops": [{"name": n, "seconds": s} for (n, cc), (s, _) in largest if cc == c][:3],
        }
        for c in CATEGORIES
    ]
    top = [
        {"name": n, "category": c, "seconds": s, "calls": int(calls), "share": share(s)}
        for (n, c), (s, calls) in largest[:k]
    ]
    return {
        "wall_s": wall_s,
        "ops_self_s": in_ops,
        "ops_self_s_by_thread": dict(threads),
        "events": int(sum(calls for _, calls in acc.values())),
        "categories": rows,
        "top_ops": top,
    }


def tree_ops(roots: list[Any]) -> Iterator[Op]:
    """``Op`` records from the profiler's C++ event tree, one at a time: a SmolLM2 update has
    about a million events, and ``prof.events()`` would hold several KB of Python per event
    (and take minutes to build). An op redispatched under its own name (autocast) is one op, as
    ``prof.events()`` counts it; self time is the op's minus its children's."""
    stack = [(r, ()) for r in reversed(roots)]
    while stack:
        e, parents = stack.pop()
        own, kids = e.duration_time_ns, e.children
        while len(kids) == 1 and kids[0].name == e.name:
            kids = kids[0].children
        own -= sum(k.duration_time_ns for k in kids)
        inputs = getattr(e.extra_fields, "inputs", None) or []
        shapes = tuple(tuple(x.sizes) if hasattr(x, "sizes") else () for x in inputs)
        yield Op(e.name, max(own, 0) / 1e9, shapes, parents, int(e.start_tid))
        inner = (e.name, *parents)
        stack.extend((k, inner) for k in reversed(kids))


def profiled_ops(prof: Any) -> Iterator[Op]:
    """The stopped profiler's ops; from ``prof.events()`` where the tree is not exposed."""
    results = getattr(prof.profiler, "kineto_results", None)
    if results is not None and hasattr(results, "experimental_event_tree"):
        yield from tree_ops(results.experimental_event_tree())
        return
    for ev in prof.events():
        parents, p = [], ev.cpu_parent
        while p is not None:
            parents.append(p.name)
            p = p.cpu_parent
        shapes = tuple(tuple(s) for s in ev.input_shapes or [])
        yield Op(ev.name, ev.self_cpu_time_total / 1e6, shapes, tuple(parents), int(ev.thread))


# ---- the run ------------------------------------------------------------------------------------
def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("overrides", nargs="*", help="key=value overrides of --config")
    p.add_argument("--config", default=str(CONFIG))
    p.add_argument("--tiny", action="store_true", help="a tiny random model (smoke test)")
    p.add_argument("--tiny-hidden", type=int, default=64)
    p.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"))
    p.add_argument("--results", type=Path, default=HERE / "results")
    p.add_argument("--threads", type=int, default=0, help="0: trainer.num_threads or torch's")
    p.add_argument("--prompt", type=int, default=0, help="prompt tokens (default 360; tiny 36)")
    p.add_argument("--responses", default=RESPONSES, help="groups ';' of lengths ','")
    p.add_argument("--tool-share", type=float, default=TOOL_SHARE)
    p.add_argument("--top", type=int, default=15, help="ops listed by self time")
    a = p.parse_args(argv)
    a.prompt = a.prompt or (36 if a.tiny else 360)
    # --dtype before the user's overrides (an explicit model.dtype=... still wins).
    a.overrides = [f"actor_rollout_ref.model.dtype={a.dtype}", *a.overrides]
    return a


def lora_rank(policy: Any) -> int:
    cfg = getattr(policy.model, "peft_config", {}).get("default") if policy.is_lora else None
    return int(cfg.r) if cfg is not None else 0


def run(a: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Load as roofline.py does, one warm-up update, one profiled; the JSON record."""
    from torch.profiler import ProfilerActivity, profile

    from toolgrpo.models.loading import load_policy

    cfg, overrides = load_cfg(a, work)
    threads = a.threads or cfg.trainer.num_threads or torch.get_num_threads()
    torch.manual_seed(cfg.trainer.seed)
    torch.set_num_threads(threads)
    policy = load_policy(cfg.actor_rollout_ref.model)
    groups = update_groups(cfg, a.responses, a.tiny)
    actor, batch = update_inputs(cfg, policy, a.prompt, groups, a.tool_share, steps=2)
    vocab, rank = int(policy.base.config.vocab_size), lora_rank(policy)
    mach = machine(threads)
    mach["flags"] = {f: f in mach["cpu_flags"] for f in FLAG_NAMES}
    print("warm-up update", flush=True)
    t0 = time.perf_counter()
    actor.update(batch)
    warm = time.perf_counter() - t0
    rss_warm = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"profiled update (warm-up took {warm:.2f} s)", flush=True)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, with_stack=False) as prof:
        t0 = time.perf_counter()
        actor.update(batch)
        wall = time.perf_counter() - t0
    print("categorising the profiler's events", flush=True)
    mach["load_avg_end"] = list(os.getloadavg())
    return {
        "model": "tiny" if a.tiny else cfg.actor_rollout_ref.model.path,
        "config": os.path.relpath(a.config, REPO),
        "overrides": [o for o in overrides if not o.startswith("actor_rollout_ref.model.path=")],
        "machine": mach,
        "dtype_option": a.dtype,
        "dtype": str(policy.dtype).removeprefix("torch."),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "vocab": vocab,
        "lora_rank": rank,
        "batch": {
            "groups": len(groups),
            "n": len(groups[0]),
            "prompt_tokens": a.prompt,
            "response_lengths": groups,
            "tool_share": a.tool_share,
        },
        "warmup_s": warm,
        **summarise(profiled_ops(prof), wall, vocab, rank, a.top),
        "max_rss_mb_after_warmup": rss_warm,
        "max_rss_mb_end": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def print_table(rec: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    title = (
        f"one actor update: {rec['model']}, {rec['dtype']}, {rec['threads']} thread(s); "
        f"{rec['wall_s']:.2f} s profiled ({rec['warmup_s']:.2f} s warm-up, unprofiled)"
    )
    t = Table(title=title)
    for c in ("category / op", "seconds", "share of wall", "what"):
        t.add_column(c, overflow="fold")
    for r in rec["categories"]:
        t.add_row(r["category"], f"{r['seconds']:.3f}", f"{r['share']:.1%}", DETAIL[r["category"]])
    t.add_row("total", f"{rec['wall_s']:.3f}", "100.0%", f"{rec['events']:,} profiler events")
    t.add_section()
    for r in rec["top_ops"]:
        what = f"{r['category']}, {r['calls']:,} calls"
        t.add_row(r["name"], f"{r['seconds']:.3f}", f"{r['share']:.1%}", what)
    Console(width=140).print(t)


def main(argv: list[str]) -> dict[str, Any]:
    a = parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="profile_update_"))
    try:
        rec = run(a, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    a.results.mkdir(parents=True, exist_ok=True)
    path = a.results / ("profile_update_tiny.json" if a.tiny else "profile_update.json")
    path.write_text(json.dumps(rec, indent=1))
    print_table(rec)
    print(f"wrote {path}")
    return rec


if __name__ == "__main__":
    main(sys.argv[1:])
