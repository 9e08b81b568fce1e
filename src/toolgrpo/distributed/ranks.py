"""The update's process group (``trainer.distributed.strategy=fsdp2``, under torchrun): who the
ranks are, how they start and leave, and the collectives the loop runs through ``Ranks``.

Every rank runs the same loop and samples its share of each step's prompt groups (or rank 0 alone,
``trainer.distributed.rollout_ranks=main``); rank 0 alone logs and writes checkpoints. Each
collective of ``Ranks`` is preceded by a meeting of the ranks (``rank_failure.py``), so a failure
on any rank ends every rank with one line instead of leaving them in the collective.
"""

from __future__ import annotations

import gc
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from toolgrpo.config.loader import ConfigError
from toolgrpo.distributed.rank_failure import EXIT_TIMEOUT_S, RankBoard
from toolgrpo.errors import UserError

T = TypeVar("T")
log = logging.getLogger(__name__)


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
    """This process's place in the update's process group (world 1 without FSDP). ``board``:
    where the ranks meet before each collective (``rank_failure.py``; None for world 1)."""

    rank: int = 0
    world: int = 1
    sharded: bool = False
    device: torch.device = torch.device("cpu")
    rollout_all: bool = False  # every rank samples its share (trainer.distributed.rollout_ranks)
    board: RankBoard | None = field(default=None, compare=False, repr=False)

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def samples(self) -> bool:
        """This rank generates rollouts (and so holds a whole rollout copy of the policy)."""
        return self.main or self.rollout_all

    def at_step(self, step: int) -> int:
        """Mark the step the loop runs (a failure line names it); returns ``step``."""
        if self.board is not None:
            self.board.step = step
        return step

    def failed(self, e: Exception) -> Exception:
        """What the loop raises for its error ``e``: with several ranks, the run's failure line,
        the same on every rank (``rank_failure.RankFailed``); in one process, ``e`` itself."""
        return e if self.board is None else self.board.fail(e)

    def _collective(self, what: str, fn: Callable[[], T]) -> T:
        """``fn`` (a collective) once every rank has come to it; a failure named either way."""
        if self.board is None:
            return fn()
        self.board.meet(what)
        try:
            return fn()
        except RuntimeError as e:  # gloo's broken connection or timeout, NCCL's error
            raise self.board.broke(what, e) from e

    def gather(self, obj: Any, what: str | None = None) -> list[Any] | None:
        """Every rank's ``obj`` on rank 0, in rank order (pickled); None on other ranks."""
        if self.world == 1:
            return [obj]
        box: list[Any] | None = [None] * self.world if self.main else None
        self._collective(
            what or _caller("the gather to rank 0"), lambda: dist.gather_object(obj, box, dst=0)
        )
        return box

    def broadcast(self, obj: Any, what: str | None = None) -> Any:
        """Rank 0's ``obj`` on every rank (pickled; batches are small next to the weights)."""
        if self.world == 1:
            return obj
        box = [obj if self.main else None]
        self._collective(
            what or _caller("rank 0's broadcast"), lambda: dist.broadcast_object_list(box, src=0)
        )
        return box[0]

    def sum_(self, t: torch.Tensor) -> torch.Tensor:
        """In-place sum over ranks; the backend's device is used for the transfer."""
        if self.world > 1:
            moved = t.to(self.device)
            self._collective(_caller("a sum over ranks"), lambda: dist.all_reduce(moved))
            t.copy_(moved)
        return t

    def max_int(self, n: int, what: str | None = None) -> int:
        if self.world == 1:
            return n
        t = torch.tensor([n], dtype=torch.long, device=self.device)
        op = dist.ReduceOp.MAX
        self._collective(what or _caller("a max over ranks"), lambda: dist.all_reduce(t, op=op))
        return int(t.item())

    def all_(self, flag: bool) -> bool:
        """True when ``flag`` is True on every rank (a collective: every rank must call it)."""
        return self.world == 1 or self.max_int(int(not flag), _caller("a vote of the ranks")) == 0

    def close(self) -> None:
        """Leave the process group (torch warns at exit about one never destroyed). Called
        while an error is handled (a failed start-up), that error is posted for the others."""
        if self.sharded:
            leave_process_group(self.board, sys.exc_info()[1])

    def mine(self, groups: list[list[int]]) -> list[list[int]]:
        """Whole groups for this rank (round-robin): a group never straddles two ranks."""
        return groups[self.rank :: self.world]


def _caller(op: str) -> str:
    """``op`` and where the loop called it (what a failure line says a rank waited for)."""
    code, line = (f := sys._getframe(2)).f_code, f.f_lineno
    name = getattr(code, "co_qualname", code.co_name)  # Python 3.11+
    return f"{op} in {name} ({os.path.basename(code.co_filename)}:{line})"


def leave_process_group(
    board: RankBoard | None = None,
    error: BaseException | None = None,
    timeout_s: float = EXIT_TIMEOUT_S,
) -> None:
    """Tear the default process group down together with the other ranks.

    A rank that destroys its gloo context while a peer still drains writes to it can make that
    peer's process abort at teardown ("terminate called without an active exception"; gloo
    issue 155; seen here once in ~25 runs of the two-rank tests, under CPU contention). So: free
    what still references finished collectives' tensors, then wait for every rank, then destroy.
    Nothing else may destroy the group first: a vLLM engine's teardown did, on its rank alone
    (``rollout.vllm_compat.process_group_kept`` stops it).
    The wait is a meeting on the store with a timeout (``RankBoard.leave``, for any backend),
    then, once every rank came, the backend's barrier (gloo's monitored one). A rank that never
    comes is named and left behind."""
    if not dist.is_initialized():
        return
    gc.collect()
    if dist.get_world_size() > 1:
        everyone = True
        if board is None and (store := default_store()) is not None:
            board = RankBoard(store, dist.get_rank(), dist.get_world_size())
        if board is not None:
            everyone = board.leave(error)
        try:
            if everyone and dist.get_backend() == "gloo":
                dist.monitored_barrier(timeout=timedelta(seconds=timeout_s))
            elif everyone:
                dist.barrier()
        except RuntimeError as e:  # a peer already gone: destroy all the same
            log.warning("leaving the process group alone: %s", e)
    dist.destroy_process_group()


_boards = [0]  # boards opened by this process: each rank opens them in the same order


def default_store() -> Any:
    """The default process group's key-value store under a prefix of this board's own, or None
    where torch does not expose it."""
    get = getattr(dist.distributed_c10d, "_get_default_store", None)
    if get is None:
        return None
    _boards[0] += 1
    return dist.PrefixStore(f"toolgrpo/{_boards[0]}", get())


def check_strategy(cfg: Any) -> None:
    """What a sharded update cannot run, each with its reason. The router (on rank 0, its
    λ·cost sent with the batch), the mixture (fixed policies sample on every rank that samples,
    rank 0 draws which groups they play; every rank corrects the broadcast batch), rollback
    negatives (rows of the batch), GAE's value head (in the root unit, saved and loaded whole)
    and async training (rank 0's rollout thread samples from its unsharded copy; the shards are
    gathered into it between updates) all run."""
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
    world, rank = dist.get_world_size(), dist.get_rank()
    store = default_store() if world > 1 else None
    board = RankBoard(store, rank, world).start() if store is not None else None
    return Ranks(rank, world, True, device, world > 1 and rollout_on_all(cfg), board)


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
