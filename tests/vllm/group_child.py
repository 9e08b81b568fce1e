"""Run by test_fsdp_ranks.py as a separate process: inside a one-rank gloo process group (as a
trainer's fsdp2 group), starts an in-process vLLM engine, samples, closes it, and prints whether
the default group is still there for the ranks' synchronized leave."""

from __future__ import annotations

import os
import sys

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


def main(store_file: str) -> None:
    import torch.distributed as dist

    from tests.vllm.conftest import ENGINE_OVERRIDES
    from toolgrpo.config.loader import load_config
    from toolgrpo.config.schema import TrainConfig
    from toolgrpo.distributed.ranks import leave_process_group
    from toolgrpo.models.loading import load_policy
    from toolgrpo.rollout.backends import make_generator
    from toolgrpo.rollout.generator import SamplingParams

    dist.init_process_group("gloo", init_method=f"file://{store_file}", rank=0, world_size=1)
    overrides = {
        **ENGINE_OVERRIDES,
        "actor_rollout_ref.model.path": "smollm2-135m",
        "actor_rollout_ref.model.dtype": "float32",
        "actor_rollout_ref.rollout.name": "vllm",
        "actor_rollout_ref.rollout.max_num_seqs": "2",
    }
    cfg = load_config(TrainConfig, None, [f"{k}={v}" for k, v in overrides.items()])
    gen = make_generator(cfg, load_policy(cfg.actor_rollout_ref.model, trainable=False))
    out = gen.generate([[1, 2, 3]], SamplingParams(n=1, max_new_tokens=2))
    print(f"SAMPLED {len(out)}", flush=True)
    gen.close()
    print(f"GROUP AFTER CLOSE {dist.is_initialized()}", flush=True)
    leave_process_group()
    print(f"GROUP AFTER LEAVE {dist.is_initialized()}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
