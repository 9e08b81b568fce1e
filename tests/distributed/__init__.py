"""Shared by the multi-rank tests."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the rendezvous of spawned gloo ranks)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def varied_score(task, text, step, flags):
    """A deterministic score that differs between samples (so advantages, returns and value
    losses are not all 0): stands in for ``rollout_stage.score``."""
    import zlib

    from toolgrpo.rewards.scoring import Score

    v = float(zlib.crc32(text.encode()) % 7) - 3.0
    return Score(v, 0.0, v, 0.0, False, False)


def _rank_main(rank: int, world: int, port: int, run, args: tuple, result: str) -> None:
    """One spawned gloo rank: its rendezvous variables, one thread, ``varied_score``."""
    import os

    import torch

    env = {"RANK": rank, "WORLD_SIZE": world, "LOCAL_RANK": rank, "MASTER_PORT": port}
    os.environ.update({"MASTER_ADDR": "127.0.0.1", **{k: str(v) for k, v in env.items()}})
    torch.set_num_threads(1)
    from toolgrpo.trainer import rollout_stage

    rollout_stage.score = varied_score  # a spawned process: nothing to undo
    run(world, args, result)


def run_world(run, world: int, args: tuple, result: str):
    """``run(world, args, result)`` in this process (world 1: the caller patches the score) or
    on ``world`` spawned gloo ranks; returns what rank 0 saved to ``result``."""
    import torch
    import torch.multiprocessing as mp

    if world == 1:
        run(1, args, result)
    else:
        mp.spawn(_rank_main, args=(world, free_port(), run, args, result), nprocs=world, join=True)
    return torch.load(result, weights_only=False)
