"""Sharded start for FSDP2: no rank reads a whole model it does not keep.

Ranks that do not sample build the policy with its parameters on the meta device (``load_policy(...,
empty=True)``); a rank that samples (rank 0, or every rank when all sample) loads its whole rollout
copy and hands the actor a meta copy of it instead of a full one. ``fully_shard`` then runs the
usual plan on the meta modules, ``to_empty`` gives each rank storage for its own shards only, and
each rank reads just its rows of every weight from the safetensors files
(``safe_open(...).get_slice``). Buffers (rotary frequencies) are computed when the modules are built
and kept; weights no file holds (a fresh LoRA adapter's random init) are rank 0's, broadcast one
tensor at a time (they are small). A checkpoint the files cannot fill (no safetensors, a weight
under another name or shape) falls back to the full load, with the reason logged once.
"""

from __future__ import annotations

import copy
import functools
import json
import logging
import math
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.distributed as dist

from toolgrpo.config.schema import ModelConfig
from toolgrpo.distributed.fsdp import Ranks, shard
from toolgrpo.models.loading import Policy, empty_model, load_policy

log = logging.getLogger(__name__)
_logged: set[str] = set()


def checkpoint_key(name: str) -> str | None:
    """The weight files' key of a parameter (PEFT's wrapping removed); None for LoRA adapter
    weights, which no base file holds."""
    if ".lora_" in name:
        return None
    return name.removeprefix("base_model.model.").replace(".base_layer.", ".")


class WeightFiles:
    """The tensors of a model directory's ``*.safetensors`` files, read by rows; counts what it
    reads, so a test can check that a rank read only its share."""

    def __init__(self, hf_dir: Path) -> None:
        self.files = weight_files(Path(hf_dir))
        self._where: dict[str, Path] = {}
        self._shapes: dict[str, tuple[int, ...]] = {}
        self.file_bytes = 0
        for f in self.files:
            with _open(f) as h:
                for k in h.keys():
                    sl = h.get_slice(k)
                    self._where[k], self._shapes[k] = f, tuple(sl.get_shape())
                    self.file_bytes += math.prod(sl.get_shape()) * _itemsize(sl.get_dtype())
        self.bytes_read = 0

    def shape(self, key: str) -> tuple[int, ...] | None:
        return self._shapes.get(key)

    def rows(self, key: str, start: int, stop: int) -> torch.Tensor:
        """Rows ``start:stop`` of ``key`` (dim 0); only those bytes are read from the file. The
        file is mapped for this read only: pages a mapping keeps touched count in the RSS."""
        with _open(self._where[key]) as h:
            t = h.get_slice(key)[start:stop]
        self.bytes_read += t.numel() * t.element_size()
        return t


def _open(path: Path):
    from safetensors import safe_open

    return safe_open(str(path), framework="pt", device="cpu")


def weight_files(hf_dir: Path) -> list[Path]:
    """The safetensors files ``from_pretrained`` reads: those the index names, if there is one
    (a directory may hold others, e.g. a consolidated copy), else every one."""
    index = hf_dir / "model.safetensors.index.json"
    if index.is_file():
        names = set(json.loads(index.read_text())["weight_map"].values())
        return sorted(hf_dir / n for n in names)
    return sorted(hf_dir.glob("*.safetensors"))


def _itemsize(safetensors_dtype: str) -> int:
    return {"F64": 8, "I64": 8, "F32": 4, "I32": 4, "BF16": 2, "F16": 2, "I16": 2}.get(
        safetensors_dtype, 1
    )


@functools.lru_cache(maxsize=8)
def blocker(hf_dir: str) -> str | None:
    """Why ``hf_dir`` cannot be loaded shard by shard, or None when it can: every parameter of
    its architecture must be in its safetensors files under the same name and shape."""
    if not weight_files(Path(hf_dir)):
        return f"no *.safetensors in {hf_dir}"
    model = empty_model(Path(hf_dir), torch.float32)
    files = WeightFiles(Path(hf_dir))
    for name, p in model.named_parameters():
        key = checkpoint_key(name)
        shape = files.shape(key) if key else None
        if shape is None:
            return f"{name} is not in {hf_dir}'s safetensors files"
        if shape != tuple(p.shape):
            return f"{name} has shape {shape} in the files, {tuple(p.shape)} in the model"
    if any(b.is_meta for b in model.buffers()):
        return "a buffer is not computed when the model is built"
    params = {n for n, _ in model.named_parameters(remove_duplicate=False)}
    stored = [k for k in model.state_dict() if k not in params and files.shape(k) is not None]
    if stored:  # the full load would take it from the files, not from the constructor
        return f"buffer {stored[0]} is stored in the files"
    return None


def sharded_start(policy_dir: Path, ranks: Ranks) -> bool:
    """Whether this run loads by shards; the reason it does not is logged once."""
    if not ranks.sharded:
        return False
    reason = blocker(str(policy_dir))
    if reason is not None and reason not in _logged:
        _logged.add(reason)
        log.warning("FSDP2 start loads the whole model on every rank: %s", reason)
    return reason is None


def start_policy(
    cfg: ModelConfig, ranks: Ranks, trainable: bool = True, whole_on_main: bool = True
) -> Policy:
    """The policy as a rank starts with it: whole where it samples (rank 0, or every rank when
    all ranks sample; ``whole_on_main``) or where loading by shards is impossible; elsewhere
    empty, for ``shard_policy`` to fill."""
    from toolgrpo.models.registry import resolve_model

    device = ranks.device
    if not sharded_start(resolve_model(cfg.path).hf_dir, ranks):
        return load_policy(cfg, trainable, device)
    return load_policy(cfg, trainable, device, empty=not (whole_on_main and ranks.samples))


def actor_policy(policy: Policy, ranks: Ranks) -> Policy:
    """The policy the actor shards. A rank that samples keeps ``policy`` whole for rollouts
    and gives the actor a copy: a meta one when the files fill the shards, else a full one;
    other ranks give their own (empty, or whole when loading by shards is impossible)."""
    if not (ranks.sharded and ranks.samples):
        return policy
    if sharded_start(policy.resolved.hf_dir, ranks):
        return replace(policy, model=meta_copy(policy.model))
    return replace(policy, model=copy.deepcopy(policy.model))


def meta_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A deep copy whose file-backed parameters are on the meta device (no memory); buffers and
    adapter weights are copied (small), tied parameters stay tied."""
    memo: dict[int, object] = {}
    for name, p in model.named_parameters():
        if checkpoint_key(name) is not None:
            meta = torch.empty_like(p, device="meta")
            memo[id(p)] = torch.nn.Parameter(meta, requires_grad=p.requires_grad)
    return copy.deepcopy(model, memo)


@dataclass(frozen=True)
class LoadStats:
    """What one rank read: bytes from the files, and the files' total."""

    bytes_read: int
    file_bytes: int


def shard_policy(
    policy: Policy, ranks: Ranks, value_head: torch.nn.Module | None = None
) -> torch.nn.Module:
    """The FSDP root of ``policy.model``: filled from the files when any rank built it empty
    (every rank then does, so the collectives match), else sharded from the loaded weights."""
    empty = ranks.max_int(int(any(p.is_meta for p in policy.model.parameters())))
    if not empty:
        return shard(policy.model, ranks, value_head)
    root, stats = shard_from_files(policy.model, policy.resolved.hf_dir, ranks, value_head)
    mib = (stats.bytes_read / 2**20, stats.file_bytes / 2**20)
    log.info("rank %d read %.1f of %.1f MiB of weights", ranks.rank, *mib)
    return root


def shard_from_files(
    model: torch.nn.Module,
    hf_dir: Path,
    ranks: Ranks,
    value_head: torch.nn.Module | None = None,
) -> tuple[torch.nn.Module, LoadStats]:
    """Shard ``model`` (meta or not) with the usual plan and fill each rank's shards from
    ``hf_dir``'s files, reading only this rank's rows of each weight."""
    files = WeightFiles(hf_dir)
    # Rank 0's values of what no file holds, and every buffer: to_empty drops both.
    extras = {f"lm.{n}": p.detach() for n, p in model.named_parameters() if not checkpoint_key(n)}
    if value_head is not None:
        extras.update({f"value_head.{n}": p.detach() for n, p in value_head.named_parameters()})
    buffers = {f"lm.{n}": b.detach().clone() for n, b in model.named_buffers()}
    root = shard(model, ranks, value_head)
    root.to_empty(device=ranks.device)
    with torch.no_grad():
        for name, p in root.named_parameters():
            local = p.to_local() if hasattr(p, "to_local") else p
            start = _row_offset(p.shape[0], local.shape[0], ranks)
            if name in extras:
                full = _from_main(extras[name], tuple(p.shape), local.dtype, ranks)
                local.copy_(full[start : start + local.shape[0]])
            elif local.shape[0]:
                key = checkpoint_key(name.removeprefix("lm."))
                local.copy_(files.rows(key, start, start + local.shape[0]))
        for name, b in buffers.items():
            root.get_buffer(name).copy_(b)
    return root, LoadStats(files.bytes_read, files.file_bytes)


def _row_offset(n: int, local_rows: int, ranks: Ranks) -> int:
    """First row of this rank's shard: FSDP2 cuts dim 0 like ``torch.chunk`` (ceil(n/world)
    rows a rank, the last ones short or empty)."""
    if not ranks.sharded or ranks.world == 1:
        return 0
    per = -(-n // ranks.world)
    start = min(ranks.rank * per, n)
    if local_rows != max(0, min(per, n - start)):
        raise RuntimeError(f"unexpected FSDP shard: {local_rows} of {n} rows on rank {ranks.rank}")
    return start


def _from_main(
    value: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype, ranks: Ranks
) -> torch.Tensor:
    """Rank 0's ``value`` on every rank (a broadcast; only small tensors go this way)."""
    if ranks.main:
        if value.is_meta:
            raise RuntimeError("rank 0 has no value for a weight that no file holds")
        out = value.to(device=ranks.device, dtype=dtype).contiguous()
    else:
        out = torch.empty(shape, dtype=dtype, device=ranks.device)
    if ranks.world > 1:
        dist.broadcast(out, src=0)
    return out
