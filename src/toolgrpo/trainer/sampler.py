"""A resumable task sampler: epoch-seeded permutations, drop_last, position kept in checkpoints."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from toolgrpo.config.loader import ConfigError


@dataclass
class SamplerState:
    epoch: int = 0
    position: int = 0


class TaskSampler:
    def __init__(self, num_tasks: int, batch_size: int, seed: int, shuffle: bool = True) -> None:
        if batch_size > num_tasks:
            raise ConfigError(
                f"data.train_batch_size={batch_size} exceeds the {num_tasks} usable training tasks"
            )
        self.num_tasks, self.batch_size, self.seed, self.shuffle = (
            num_tasks,
            batch_size,
            seed,
            shuffle,
        )
        self.state = SamplerState()

    def _order(self, epoch: int) -> list[int]:
        if not self.shuffle:
            return list(range(self.num_tasks))
        g = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
        return torch.randperm(self.num_tasks, generator=g).tolist()

    def next_batch(self) -> list[int]:
        """Indices of the next batch; a short tail is dropped and the next epoch begins."""
        if self.state.position + self.batch_size > self.num_tasks:
            self.state = SamplerState(self.state.epoch + 1, 0)
        order = self._order(self.state.epoch)
        s = self.state.position
        self.state.position += self.batch_size
        return order[s : s + self.batch_size]

    def state_dict(self) -> dict[str, int]:
        return asdict(self.state)

    def load_state_dict(self, d: dict[str, int]) -> None:
        self.state = SamplerState(**d)
