"""The pure parts of benchmarks/roofline.py: FLOP and byte counts of a Llama-style model's decode
step and GRPO update, the bounds they imply on this machine, and the README rows.

Conventions (those of MFU accounting): only matmuls count (norms, rotary, SiLU, softmax do not);
a matmul of an ``[m, k]`` input by a ``[k, n]`` weight is ``2·m·k·n`` FLOPs; attention is the two
score/value products, ``4·heads·head_dim`` FLOPs per (query, key) pair and layer, causal pairs
only.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16")
UPDATE_TARGET = 0.5  # issue #19: the update at >= 50 % of the measured GEMM peak
GENERATION_TARGET = 0.4  # and generation at >= 40 % of its bound at the main job's batch
FLOP_PARTS = ("forward", "backward", "recompute")


@dataclass(frozen=True)
class ModelShape:
    """What the counts need from a Llama-style config (SmolLM2: 576 / 1536 / 30 / 9 / 3 / 64)."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int

    @classmethod
    def from_config(cls, cfg: Any) -> ModelShape:
        """From a transformers ``PretrainedConfig`` (LlamaConfig and look-alikes)."""
        heads = int(cfg.num_attention_heads)
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        return cls(
            hidden=int(cfg.hidden_size),
            intermediate=int(cfg.intermediate_size),
            layers=int(cfg.num_hidden_layers),
            heads=heads,
            kv_heads=int(getattr(cfg, "num_key_value_heads", None) or heads),
            head_dim=int(head_dim),
            vocab=int(cfg.vocab_size),
        )


def linear_dims(s: ModelShape) -> dict[str, tuple[int, int]]:
    """``(in, out)`` of each projection of one decoder layer."""
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    return {
        "q_proj": (s.hidden, q),
        "k_proj": (s.hidden, kv),
        "v_proj": (s.hidden, kv),
        "o_proj": (q, s.hidden),
        "gate_proj": (s.hidden, s.intermediate),
        "up_proj": (s.hidden, s.intermediate),
        "down_proj": (s.intermediate, s.hidden),
    }


def body_params(s: ModelShape) -> int:
    """Matmul weights of the decoder layers (embeddings, norms and the LM head excluded)."""
    return s.layers * sum(i * o for i, o in linear_dims(s).values())


def head_params(s: ModelShape) -> int:
    """The LM head's weights (tied to the embeddings in SmolLM2: read once per step either way)."""
    return s.hidden * s.vocab


def lora_params(s: ModelShape, rank: int, targets: tuple[str, ...] | list[str]) -> int:
    """LoRA A and B weights: ``rank·(in + out)`` per adapted projection and layer."""
    dims = linear_dims(s)
    unknown = sorted(set(targets) - set(dims))
    if unknown:
        raise ValueError(f"unknown LoRA targets {unknown}; known: {list(dims)}")
    return s.layers * sum(rank * (dims[t][0] + dims[t][1]) for t in targets)


def attention_flops_per_pair(s: ModelShape) -> int:
    """Forward FLOPs of one (query, key) pair over all layers: q·k and p·v, per query head."""
    return 4 * s.heads * s.head_dim * s.layers


def causal_pairs(start: int, n: int) -> int:
    """(query, key) pairs of ``n`` tokens at positions ``start .. start+n-1`` attending causally
    to everything before them and themselves: ``Σ (start + j + 1)``."""
    if n <= 0:
        return 0
    return n * (start + 1) + n * (n - 1) // 2


def kv_bytes_per_token(s: ModelShape, dtype_bytes: int) -> int:
    """Keys and values of one cached token over all layers."""
    return 2 * s.layers * s.kv_heads * s.head_dim * dtype_bytes


def gemm_flops(m: int, k: int, n: int) -> int:
    return 2 * m * k * n


# ---- the update ---------------------------------------------------------------------------------
def shared_prefix_tokens(prompt: int, lengths: list[int]) -> int:
    """Tokens a group costs when the prompt runs once for its n responses (toolgrpo)."""
    return prompt + sum(lengths)


def flat_tokens(prompt: int, lengths: list[int]) -> int:
    """Tokens the same group costs as n full rows (prompt repeated, padded to the longest)."""
    return len(lengths) * (prompt + max(lengths, default=0))


def update_flops(
    s: ModelShape,
    prompt: int,
    lengths: list[int],
    n_lora: int,
    recompute_head: bool = False,
    recompute_body: bool = False,
    scored: list[int] | None = None,
) -> dict[str, int]:
    """FLOPs of one forward + backward of a GRPO group through ``shared_prefix_logprobs``.

    The backbone runs the prompt once (``prompt`` tokens) and each response minus its last token
    against the prompt's cache; the LM head runs only at the policy's own tokens, ``Σ scored``
    (every response position when ``scored`` is None; tool output is not scored).
    Frozen base weights need a forward (2·N per token) and the gradient w.r.t. their input
    (2·N), not their own gradient; LoRA's A and B need all three (6·N_lora). Attention's backward
    is twice its forward. With ``recompute_head`` the LM head's forward runs again in backward
    (toolgrpo checkpoints each chunk so no ``[B, T, V]`` logits live), and with
    ``recompute_body`` (gradient checkpointing) the backbone's: executed, not model, FLOPs.
    Approximation: it counts the input gradient of layer 0's q/k/v projections, which autograd
    skips (their input comes from the frozen embeddings): about 0.25 % of SmolLM2's total.
    """
    n_body, n_head = body_params(s), head_params(s)
    tokens = prompt + sum(max(r - 1, 0) for r in lengths)
    positions = sum(lengths if scored is None else scored)
    pairs = causal_pairs(0, prompt) + sum(causal_pairs(prompt, r - 1) for r in lengths)
    attn = attention_flops_per_pair(s) * pairs
    out = {
        "backbone_tokens": tokens,
        "head_positions": positions,
        "attention_pairs": pairs,
        "forward_body": 2 * n_body * tokens,
        "forward_lora": 2 * n_lora * tokens,
        "forward_head": 2 * n_head * positions,
        "forward_attention": attn,
        "backward_body": 2 * n_body * tokens,
        "backward_lora": 4 * n_lora * tokens,
        "backward_head": 2 * n_head * positions,
        "backward_attention": 2 * attn,
        "recompute_head": 2 * n_head * positions if recompute_head else 0,
        "recompute_body": 2 * (n_body + n_lora) * tokens + attn if recompute_body else 0,
    }
    out["total"] = sum(v for k, v in out.items() if k.split("_")[0] in FLOP_PARTS)
    return out


def bucket_widths(lengths: list[int], buckets: list[list[int]]) -> list[int]:
    """Each row's executed length when its length bucket is padded to its longest row."""
    widths = list(lengths)
    for rows in buckets:
        w = max(lengths[i] for i in rows)
        for i in rows:
            widths[i] = w
    return widths


def sum_counts(counts: list[dict[str, int]]) -> dict[str, int]:
    return {k: sum(c[k] for c in counts) for k in counts[0]} if counts else {}


# ---- generation ---------------------------------------------------------------------------------
def decode_flops_per_token(s: ModelShape, context: int) -> int:
    """Forward FLOPs of one decoded token attending ``context`` keys (LoRA merged: none extra)."""
    return 2 * (body_params(s) + head_params(s)) + attention_flops_per_pair(s) * context


def decode_bytes_per_step(
    s: ModelShape, batch: int, context: int, weight_bytes: int, kv_bytes: int
) -> int:
    """Bytes one decode step must read: every weight once, plus each sequence's KV cache (a
    paged-attention kernel reads every sequence's blocks, shared prompt blocks included)."""
    weights = (body_params(s) + head_params(s)) * weight_bytes
    return weights + batch * context * kv_bytes_per_token(s, kv_bytes)


def decode_bound(
    s: ModelShape,
    batch: int,
    prompt: int,
    new_tokens: int,
    peak_flops: float,
    bandwidth: float,
    weight_bytes: int,
    kv_bytes: int | None = None,
) -> dict[str, Any]:
    """The fastest decode of ``new_tokens - 1`` steps after prefill (step k feeds token k-1 and
    attends ``prompt + k`` keys), each step taking ``max(FLOPs / peak, bytes / bandwidth)``.

    Returns tokens/s of that roofline and of each roof alone, which one binds, and the same
    with weights alone (the KV cache left out) for reference."""
    kv_bytes = weight_bytes if kv_bytes is None else kv_bytes
    steps = range(1, max(new_tokens, 2))
    flops = [batch * decode_flops_per_token(s, prompt + k) for k in steps]
    nbytes = [decode_bytes_per_step(s, batch, prompt + k, weight_bytes, kv_bytes) for k in steps]
    weights_only = (body_params(s) + head_params(s)) * weight_bytes
    tokens = batch * len(flops)
    t_compute = sum(f / peak_flops for f in flops)
    t_memory = sum(b / bandwidth for b in nbytes)
    t_roof = sum(max(f / peak_flops, b / bandwidth) for f, b in zip(flops, nbytes, strict=True))
    t_weights = sum(max(f / peak_flops, weights_only / bandwidth) for f in flops)
    return {
        "tok_s": tokens / t_roof,
        "compute_tok_s": tokens / t_compute,
        "memory_tok_s": tokens / t_memory,
        "limiter": "memory" if t_memory >= t_compute else "compute",
        "tok_s_weights_only": tokens / t_weights,
        "flops_per_token_mean": sum(flops) / tokens,
        "bytes_per_step_mean": sum(nbytes) / len(nbytes),
        "weight_bytes_per_step": weights_only,
        "context_mean": prompt + (len(flops) + 1) / 2,
    }


# ---- machine ------------------------------------------------------------------------------------
def cpu_flags(cpuinfo: str) -> list[str]:
    """The features that decide torch's CPU speed (AVX2 vs AVX512 / native bf16), from
    /proc/cpuinfo's first ``flags`` line."""
    line = next((ln for ln in cpuinfo.splitlines() if ln.startswith("flags")), "")
    words = set(line.split(":", 1)[-1].split())
    return [f for f in FLAGS if f in words]


def shape_dict(s: ModelShape) -> dict[str, int]:
    return asdict(s)


# ---- shapes and references ----------------------------------------------------------------------
def group_lengths(
    pattern: list[list[int]], groups: int, n: int, scale: float = 1.0
) -> list[list[int]]:
    """``groups`` groups of ``n`` response lengths, cycling through ``pattern``'s lengths (scaled,
    at least 2 tokens each), so a config with another group size keeps the same length mix."""
    flat = [max(2, round(r * scale)) for g in pattern for r in g]
    if not flat:
        raise ValueError("empty response-length pattern")
    return [[flat[(i * n + j) % len(flat)] for j in range(n)] for i in range(groups)]


def scored_tokens(length: int, tool_share: float) -> int:
    """The policy's own tokens in a response of ``length`` whose ``tool_share`` is tool output
    (at least one: every episode has a turn of the model's)."""
    return max(1, min(length, round(length * (1.0 - tool_share))))


def response_mask(length: int, tool_share: float) -> list[int]:
    """A multi-turn row's mask: the model's call, the tool's output (0), the model's answer."""
    own = scored_tokens(length, tool_share)
    first = (own + 1) // 2
    return [1] * first + [0] * (length - own) + [1] * (own - first)


def parse_groups(text: str) -> list[list[int]]:
    """``"440,60,80,100;200,150,120,90"`` → groups of response lengths."""
    out = [[int(x) for x in g.split(",") if x.strip()] for g in text.split(";") if g.strip()]
    if not out or any(not g or min(g) < 1 for g in out):
        raise ValueError(f"bad response lengths {text!r}: groups ';'-separated, lengths >= 1")
    return out


def main_job_reference(lines: list[str]) -> dict[str, float]:
    """Medians over the main job's training steps (metrics.jsonl lines) of what the synthetic
    shapes imitate and of its measured phase times."""
    import json
    import statistics

    keys = (
        "prompt_length/mean",
        "response_length/mean",
        "response_length/max",
        "response_length/sampled_mean",
        "timing/gen_s",
        "timing/train_s",
        "tokens/generated",
    )
    rows = [json.loads(ln) for ln in lines if ln.strip()]
    rows = [r for r in rows if r.get("step", 0) >= 1 and "timing/train_s" in r]
    out: dict[str, float] = {"steps": float(len(rows))}
    for k in keys:
        vals = [float(r[k]) for r in rows if k in r]
        if vals:
            out[k] = statistics.median(vals)
    shares = [
        1.0 - float(r["response_length/sampled_mean"]) / float(r["response_length/mean"])
        for r in rows
        if r.get("response_length/mean") and "response_length/sampled_mean" in r
    ]
    if shares:  # the part of each episode after the prompt that is tool output
        out["tool_share"] = statistics.median(shares)
    return out


# ---- the table ---------------------------------------------------------------------------------
COLUMNS = ("quantity", "measured", "bound", "fraction", "basis")


def _threads(t: str) -> str:
    return f"{t} thread{'' if t == '1' else 's'}"


def table_rows(rec: dict[str, Any]) -> list[tuple[str, ...]]:
    """The result table: machine roofs, then the two measured fractions of their bounds."""
    rows: list[tuple[str, ...]] = []
    for dtype, by_threads in rec["peaks"]["gemm"].items():
        for t, v in by_threads.items():
            m, k, n = v["best_shape"]
            basis = f"best of {len(v['shapes'])} shapes: {m}x{k} @ {k}x{n}"
            name = f"GEMM peak, {dtype}, {_threads(t)}"
            rows.append((name, f"{v['gflops']:.1f} GFLOP/s", "", "", basis))
    for t, v in rec["peaks"]["bandwidth"].items():
        basis = f"{v['mb']} MB: copy {v['copy_gbs']:.1f} (read + write), sum {v['read_gbs']:.1f}"
        rows.append((f"memory bandwidth, {_threads(t)}", f"{v['gbs']:.1f} GB/s", "", "", basis))
    g = rec.get("generation")
    if g:
        b = g["bound"]
        name = (
            f"generation: decode at batch {g['batch']} "
            f"({g['backend']}, {g['dtype']}, {_threads(str(g['threads']))})"
        )
        basis = (
            f"{b['bytes_per_step_mean'] / 1e6:.4g} MB/step (weights "
            f"{b['weight_bytes_per_step'] / 1e6:.4g}, the rest KV cache at context "
            f"{b['context_mean']:.0f}), {b['flops_per_token_mean'] / 1e6:.4g} MFLOP/token"
        )
        bound = f"{b['tok_s']:.1f} tok/s ({b['limiter']})"
        rows.append((name, f"{g['decode_tok_s']:.1f} tok/s", bound, f"{g['fraction']:.0%}", basis))
    u = rec.get("update")
    if u:
        name = f"update: LoRA forward + backward ({u['dtype']}, {_threads(str(u['threads']))})"
        basis = (
            f"{u['flops_model'] / 1e9:.4g} GFLOP in {u['seconds']:.2f} s; {u['groups']} groups "
            f"x {u['n']}, {u['tokens_shared_prefix']} tokens shared-prefix (flat "
            f"{u['tokens_flat']}); executed FLOPs {u['fraction_executed']:.0%} of peak"
        )
        measured = f"{u['gflops_model']:.1f} GFLOP/s"
        bound = f"{u['peak_gflops']:.1f} GFLOP/s (GEMM peak)"
        rows.append((name, measured, bound, f"{u['fraction_model']:.0%}", basis))
    return rows


def markdown_rows(rec: dict[str, Any]) -> list[str]:
    head = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    return head + ["| " + " | ".join(r) + " |" for r in table_rows(rec)]
