"""Run by test_async.py as a separate process: starts an async engine, prints its engine
process's pid, then waits to be killed."""

from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


def main() -> None:
    from tests.vllm.conftest import ENGINE_OVERRIDES
    from toolgrpo.config.loader import load_config
    from toolgrpo.config.schema import TrainConfig
    from toolgrpo.models.loading import load_policy
    from toolgrpo.rollout.backends import make_generator

    overrides = {
        **ENGINE_OVERRIDES,
        "actor_rollout_ref.model.path": "smollm2-135m",
        "actor_rollout_ref.model.dtype": "float32",
        "actor_rollout_ref.rollout.name": "vllm",
        "actor_rollout_ref.rollout.mode": "async",
        "actor_rollout_ref.rollout.max_num_seqs": "2",  # another engine: keep it small
    }
    cfg = load_config(TrainConfig, None, [f"{k}={v}" for k, v in overrides.items()])
    gen = make_generator(cfg, load_policy(cfg.actor_rollout_ref.model, trainable=False))
    print(f"ENGINE {gen._live().engine_pid}", flush=True)
    time.sleep(600)
    sys.exit(1)


if __name__ == "__main__":
    main()
