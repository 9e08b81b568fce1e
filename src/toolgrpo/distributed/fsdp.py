"""Data-parallel FSDP2 for the update (``trainer.distributed.strategy=fsdp2``, under torchrun).

The actor (and reference) are sharded with ``torch.distributed.fsdp.fully_shard``: one unit per
decoder layer plus a root owning the embeddings, final norm, LM head and value head. The root,
``ShardedLM``, runs whatever log-prob function it is given, so the log-prob code (which calls the
decoder and the head separately) goes through one FSDP root, and tied embeddings stay in one
unit. The process group itself (``Ranks``, start and exit) is ``ranks.py``'s.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist

# The process group's names, re-exported for the modules that import them from here.
from toolgrpo.distributed.ranks import DistributedSetupError as DistributedSetupError
from toolgrpo.distributed.ranks import Ranks as Ranks
from toolgrpo.distributed.ranks import check_strategy as check_strategy
from toolgrpo.distributed.ranks import leave_process_group as leave_process_group
from toolgrpo.distributed.ranks import resolve_device as resolve_device
from toolgrpo.distributed.ranks import rollout_on_all as rollout_on_all
from toolgrpo.distributed.ranks import start_ranks as start_ranks


class ShardedLM(torch.nn.Module):
    """FSDP root: holds the policy module (and the value head), runs a log-prob function."""

    def __init__(self, lm: torch.nn.Module, value_head: torch.nn.Module | None = None) -> None:
        super().__init__()
        self.lm = lm
        self.value_head = value_head

    def forward(self, fn: Callable[[], Any]) -> Any:
        return fn()


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks (each one FSDP unit): the ``*DecoderLayer`` modules."""
    return [m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")]


def shard(lm: torch.nn.Module, ranks: Ranks, value_head: torch.nn.Module | None = None):
    """``lm`` (and ``value_head``) sharded in place over ``ranks``; returns the FSDP root."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(ranks.device.type, (ranks.world,))
    for layer in decoder_layers(lm):
        fully_shard(layer, mesh=mesh)
    root = ShardedLM(lm, value_head)
    fully_shard(root, mesh=mesh)
    return root


def full_tensors(root: torch.nn.Module, only_trainable: bool) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name under root.lm, full tensor)`` one parameter at a time: a collective every rank runs
    in the same order, so at most one unsharded parameter exists beside the shards."""
    for name, p in root.named_parameters():
        if only_trainable and not p.requires_grad:
            continue
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        yield name, full.detach()


def gather_into(root: torch.nn.Module, target: torch.nn.Module | None, only_trainable: bool):
    """Copy the sharded weights into this rank's unsharded ``target`` (None on a rank that
    keeps no rollout copy)."""
    params = dict(target.named_parameters()) if target is not None else None
    with torch.no_grad():
        for name, full in full_tensors(root, only_trainable):
            key = name.removeprefix("lm.")
            if params is not None and key in params:
                params[key].copy_(full.to(params[key].device))


def load_full_into(root: torch.nn.Module, full: dict[str, torch.Tensor], under: str = "lm") -> None:
    """Rank 0's full weights (names under ``root.<under>``) into the shards of every rank."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    sd = {f"{under}.{k}": v for k, v in full.items()}
    opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=False)
    set_model_state_dict(root, sd if dist.get_rank() == 0 else {}, options=opts)


def full_optimizer_state(root: torch.nn.Module, optimizer: Any) -> dict[str, Any]:
    """The optimizer's state unsharded and keyed by position, as ``optimizer.state_dict()`` of
    the same run in one process keys it, so a checkpoint loads in one process or any world."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    sd = get_optimizer_state_dict(root, optimizer, options=opts)
    if not sd:  # offloaded full state lands on rank 0 only
        return {}
    index: dict[str, int] = {}
    groups = []
    for g in sd["param_groups"]:
        ids = [index.setdefault(fqn, len(index)) for fqn in g["params"]]
        groups.append({**g, "params": ids})
    state = {index[fqn]: st for fqn, st in sd["state"].items() if fqn in index}
    return {"state": state, "param_groups": groups}


class FsdpOptimizerView:
    """What ``load_optimizer`` needs of an optimizer, loading a position-keyed full state into
    a sharded one (the reverse of ``full_optimizer_state``)."""

    def __init__(self, root: torch.nn.Module, optimizer: Any) -> None:
        self.root, self.optimizer = root, optimizer
        self.state: dict[Any, Any] = {}  # set_optimizer_state_dict checks the shapes itself

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_optimizer_state_dict,
            set_optimizer_state_dict,
        )

        names = [
            fqn
            for g in get_optimizer_state_dict(
                self.root, self.optimizer, options=StateDictOptions(full_state_dict=True)
            )["param_groups"]
            for fqn in g["params"]
        ]
        n_saved = sum(len(g["params"]) for g in sd["param_groups"])
        if n_saved != len(names):
            raise ValueError(f"{n_saved} saved parameters for {len(names)} trainable ones")
        groups, start = [], 0
        for g in sd["param_groups"]:
            groups.append({**g, "params": names[start : start + len(g["params"])]})
            start += len(g["params"])
        state = {names[i]: st for i, st in sd["state"].items()}
        set_optimizer_state_dict(
            self.root,
            self.optimizer,
            {"state": state, "param_groups": groups},
            options=StateDictOptions(full_state_dict=True),
        )


def full_module_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``module.state_dict()`` with whole tensors on the CPU where FSDP2 sharded them, as one
    process saves it (the value head). A collective: every rank calls it, in the same order."""
    whole = {}
    for name, t in module.state_dict().items():
        full = t.full_tensor() if hasattr(t, "full_tensor") else t
        whole[name] = full.detach().cpu().clone()
    return whole


def load_full_module_state(root: torch.nn.Module, name: str, full: dict[str, torch.Tensor]) -> None:
    """Rank 0's whole ``full`` (``root.<name>.state_dict()``'s keys, e.g. a one-process
    checkpoint's value head) into every rank's shards of that submodule; a collective."""
    own = {k: tuple(t.shape) for k, t in root.get_submodule(name).state_dict().items()}
    got = {k: tuple(t.shape) for k, t in full.items()}
    if full and got != own:  # load_state_dict's check, before any rank enters the broadcast
        raise ValueError(f"{name}: saved tensors {got} do not fit {own}")
    load_full_into(root, full, under=name)
