"""Data-parallel FSDP2 for the update (``trainer.distributed.strategy=fsdp2``, under torchrun).

Every rank runs the same loop and samples its share of each step's prompt groups (or rank 0 alone,
``trainer.distributed.rollout_ranks=main``); rank 0 alone logs and writes checkpoints. The actor
(and reference) are sharded with ``torch.distributed.fsdp.fully_shard``: one unit per decoder layer
plus a root owning the embeddings, final norm, LM head and value head. The root, ``ShardedLM``, runs
whatever log-prob function it is given, so the log-prob code (which calls the decoder and the head
separately) goes through one FSDP root, and tied embeddings stay in one unit.
"""

from __future__ import annotations

import gc
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from toolgrpo.config.loader import ConfigError
from toolgrpo.errors import UserError


class DistributedSetupError(UserError):
    """A device or process-group setting this machine or launch cannot honour."""


def resolve_device(name: str) -> torch.device:
    """``trainer.device``: ``auto`` is CUDA when available (the local rank's GPU), else CPU."""
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if name == "auto":
        return torch.device("cuda", local) if torch.cuda.is_available() else torch.device("cpu")
    if name == "cpu":
        return torch.device("cpu")
    if name == "cuda" or name.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise DistributedSetupError(
                f"trainer.device={name} but CUDA is not available here "
                f"(torch {torch.__version__}); use trainer.device=auto or cpu"
            )
        return torch.device(name) if ":" in name else torch.device("cuda", local)
    raise DistributedSetupError(f"trainer.device must be auto, cpu, cuda or cuda:N, got {name!r}")


@dataclass(frozen=True)
class Ranks:
    """This process's place in the update's process group (world 1 without FSDP)."""

    rank: int = 0
    world: int = 1
    sharded: bool = False
    device: torch.device = torch.device("cpu")
    rollout_all: bool = False  # every rank samples its share (trainer.distributed.rollout_ranks)

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def samples(self) -> bool:
        """This rank generates rollouts (and so holds a whole rollout copy of the policy)."""
        return self.main or self.rollout_all

    def gather(self, obj: Any) -> list[Any] | None:
        """Every rank's ``obj`` on rank 0, in rank order (pickled); None on other ranks."""
        if self.world == 1:
            return [obj]
        box: list[Any] | None = [None] * self.world if self.main else None
        dist.gather_object(obj, box, dst=0)
        return box

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank (pickled; batches are small next to the weights)."""
        if self.world == 1:
            return obj
        box = [obj if self.main else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def sum_(self, t: torch.Tensor) -> torch.Tensor:
        """In-place sum over ranks; the backend's device is used for the transfer."""
        if self.world > 1:
            moved = t.to(self.device)
            dist.all_reduce(moved)
            t.copy_(moved)
        return t

    def max_int(self, n: int) -> int:
        if self.world == 1:
            return n
        t = torch.tensor([n], dtype=torch.long, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())

    def all_(self, flag: bool) -> bool:
        """True when ``flag`` is True on every rank (a collective: every rank must call it)."""
        return self.world == 1 or self.max_int(int(not flag)) == 0

    def close(self) -> None:
        """Leave the process group (torch warns at exit about one never destroyed)."""
        if self.sharded:
            leave_process_group()

    def mine(self, groups: list[list[int]]) -> list[list[int]]:
        """Whole groups for this rank (round-robin): a group never straddles two ranks."""
        return groups[self.rank :: self.world]


def leave_process_group(timeout_s: float = 60.0) -> None:
    """Tear the default process group down together with the other ranks.

    A rank that destroys its gloo context while a peer still drains writes to it can make that
    peer's process abort at teardown ("terminate called without an active exception"; gloo
    issue 155; seen here once in ~25 runs of the two-rank tests, under CPU contention). So: free
    what still references finished collectives' tensors, then wait for every rank (a monitored
    barrier, which names a rank that never comes instead of hanging when one has died), then
    destroy."""
    if not dist.is_initialized():
        return
    gc.collect()
    if dist.get_world_size() > 1:
        try:
            if dist.get_backend() == "gloo":
                dist.monitored_barrier(timeout=timedelta(seconds=timeout_s))
            else:
                dist.barrier()
        except RuntimeError as e:  # a peer already gone: destroy all the same
            logging.getLogger(__name__).warning("leaving the process group alone: %s", e)
    dist.destroy_process_group()


def check_strategy(cfg: Any) -> None:
    """What a sharded update cannot run, each with its reason. The router (on rank 0, its
    λ·cost sent with the batch), the mixture (fixed policies sample on rank 0; every rank
    corrects the broadcast batch), rollback negatives (rows of the batch), GAE's value head
    (in the root unit, saved and loaded whole) and async training (rank 0's rollout thread
    samples from its unsharded copy; the shards are gathered into it between updates) all run."""
    strategy = cfg.trainer.distributed.strategy
    if strategy == "none":
        return
    refused = {
        "router.lr=null": (
            cfg.router.enable and cfg.router.lr is None,
            "it puts the router head (on rank 0 only) into the actor's optimizer, whose state "
            "is sharded over every rank; give the head its own SGD with router.lr",
        ),
    }
    on = [f"{k} ({why})" for k, (bad, why) in refused.items() if bad]
    if on:
        raise ConfigError(
            f"trainer.distributed.strategy={strategy} does not support {'; '.join(on)}; "
            "use strategy=none for it"
        )


def start_ranks(cfg: Any) -> Ranks:
    """Join (or, for one process without torchrun, create) the process group the config asks
    for; every misfit between the config and the launch is a one-line error here."""
    check_strategy(cfg)
    t = cfg.trainer
    device = resolve_device(t.device)
    strategy = t.distributed.strategy
    env_world = int(os.environ.get("WORLD_SIZE", "1"))
    if strategy == "none":
        if env_world > 1:
            raise DistributedSetupError(
                f"launched with {env_world} processes (WORLD_SIZE) but "
                "trainer.distributed.strategy=none; set it to fsdp2 or launch one process"
            )
        return Ranks(device=device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if not dist.is_available() or not getattr(dist, f"is_{backend}_available")():
        raise DistributedSetupError(
            f"trainer.distributed.strategy={strategy} on {device.type} needs the {backend} "
            f"backend, which this torch build ({torch.__version__}) lacks"
        )
    want = t.nnodes * t.n_gpus_per_node
    if t.n_gpus_per_node > 0 and want != env_world:
        raise DistributedSetupError(
            f"trainer.nnodes × trainer.n_gpus_per_node = {want}, but torchrun started "
            f"{env_world} processes"
        )
    _check_divides(cfg, env_world)
    if not dist.is_initialized():
        if "RANK" not in os.environ:  # one process without torchrun: a private group of one
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", str(_free_port()))
            os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(backend)
    world = dist.get_world_size()
    return Ranks(dist.get_rank(), world, True, device, world > 1 and rollout_on_all(cfg))


def rollout_on_all(cfg: Any) -> bool:
    """``trainer.distributed.rollout_ranks`` resolved: with the local backend every rank samples
    unless ``main``; with Ray, rank 0's pool samples (``all`` is refused: the pool is the
    scale-out of generation there)."""
    d = cfg.trainer.distributed
    if cfg.async_training.enable:  # one rollout thread, on rank 0, beside the update
        if d.rollout_ranks == "all":
            raise ConfigError(
                "trainer.distributed.rollout_ranks=all with async_training.enable: the rollout "
                "thread runs on rank 0 beside the sharded update (a collective from a second "
                "thread on every rank would race the update's); leave rollout_ranks=auto"
            )
        return False
    if d.backend == "ray":
        if d.rollout_ranks == "all":
            raise ConfigError(
                "trainer.distributed.rollout_ranks=all with backend=ray: the Ray rollout pool "
                "samples for every rank; size it with trainer.distributed.num_rollout_workers "
                "and leave rollout_ranks=auto"
            )
        return False
    return d.rollout_ranks != "main"


def _check_divides(cfg: Any, world: int) -> None:
    """Each mini-batch's groups split evenly over the ranks, or the split would be lopsided."""
    a = cfg.actor_rollout_ref.actor
    bs = cfg.data.train_batch_size
    mini = min(max(1, a.ppo_mini_batch_size), bs)
    if bs % world or mini % world:
        raise DistributedSetupError(
            f"{world} ranks cannot share data.train_batch_size={bs} groups in mini-batches of "
            f"actor_rollout_ref.actor.ppo_mini_batch_size={a.ppo_mini_batch_size}: both must be "
            f"multiples of the world size"
        )


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
