"""Every FSDP2 rank samples its share of a step (``trainer.distributed.rollout_ranks=all``).

Rank 0 decides what is random or stateful about the step (its tasks, the mixture's policy per
group, the router's routes) and sends it to every rank. Each rank then plays whole prompt groups,
round-robin (task ``t`` goes to rank ``t % world``), with its own rollout copy and environments.
The deal runs on from one part of a mixture to the next (the actor's tasks, then a fixed
policy's), so the ranks share each policy's groups instead of rank 0 taking every part's first.
The samples travel back to rank 0, which puts them in the order one process would have produced
(task-major, ``n`` per task), rewards and collates them, and broadcasts the batch as before.
With greedy decoding the batch equals one process's; with sampling each rank draws from its own
seeded stream. A rank that fails in its share ends every rank (``rank_failure.py``): the others
learn of it at the gather, or at once while they still sample.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from toolgrpo.distributed.ranks import Ranks

T = TypeVar("T")


@dataclass
class RolloutShare:
    """This rank's part in a step's generation."""

    ranks: Ranks
    _played: set[int] = field(default_factory=set)  # rank 0: ranks that sent samples this step
    # The rank dealt the next part's first task. A step deals data.train_batch_size tasks, a
    # multiple of the world size, so every step starts at rank 0.
    _first: int = 0

    @property
    def main(self) -> bool:
        return self.ranks.main

    def mine(self, items: Sequence[T]) -> list[T]:
        """This rank's tasks of a part: every ``world``-th, from where the deal stands (whole
        groups)."""
        return list(items[(self.ranks.rank - self._first) % self.ranks.world :: self.ranks.world])

    def my_rows(self, rows: Sequence[T], n: int) -> list[T]:
        """The per-sample rows (``n`` per task, task-major) of this rank's tasks."""
        tasks = range(len(rows) // n)
        return [rows[t * n + k] for t in self.mine(tasks) for k in range(n)]

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's decision about the step's rollout (the mixture's draw, the router's routes)
        on every rank."""
        return self.ranks.broadcast(obj, "rank 0's plan of the rollout (routes, policies)")

    def gather(self, mine: list[Any], n_tasks: int, n: int) -> list[Any] | None:
        """Every rank's samples of one part (``n`` per task of its share) on rank 0, in one
        process's order; None on the other ranks. A collective: every rank calls it."""
        expected = len(self.mine(range(n_tasks))) * n
        if len(mine) != expected:
            rank = self.ranks.rank
            raise ValueError(f"rank {rank} sampled {len(mine)} rows, expected {expected}")
        got = self.ranks.gather(mine, "every rank's share of the rollout")
        first, self._first = self._first, (self._first + n_tasks) % self.ranks.world
        if got is None:
            return None
        self._played.update(r for r, rows in enumerate(got) if rows)
        return interleave(got, n_tasks, n, first)

    def take_sampling_ranks(self) -> int:
        """Rank 0: how many ranks sent samples since the last call (``rollout/sampling_ranks``)."""
        n = len(self._played)
        self._played.clear()
        return n


def interleave(per_rank: Sequence[Sequence[T]], n_tasks: int, n: int, first: int = 0) -> list[T]:
    """Rank-ordered shares back in task order, ``n`` rows a task: task ``t`` was dealt to rank
    ``(first + t) % world``, the ``t // world``-th of that rank's."""
    world = len(per_rank)
    out: list[T] = []
    for t in range(n_tasks):
        j = t // world
        out.extend(per_rank[(first + t) % world][j * n : (j + 1) * n])
    return out
