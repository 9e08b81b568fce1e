"""The Ray tier: one local cluster (2 CPUs) for the whole tier, run in its own pytest process.

Skipped when ray does not import, unless TOOLGRPO_REQUIRE_BACKENDS=1 (CI), which makes that a
failure. Workers are separate processes: they find the tiny model through the absolute path in
the config, and the test environment (TOOLGRPO_CACHE, HF_HUB_OFFLINE, ...) through the env vars
the pool forwards to them.
"""

from __future__ import annotations

import math
import os
import time
import zlib
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.conftest import read_metrics, train_overrides

os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # no token file or warning for a local cluster

RAY_CPUS = 2


def _import_ray():
    try:
        import ray
    except ImportError as exc:
        if os.environ.get("TOOLGRPO_REQUIRE_BACKENDS") == "1":
            pytest.fail(f"TOOLGRPO_REQUIRE_BACKENDS=1 but ray does not import: {exc}")
        pytest.skip(f"ray is not installed ({exc}): pip install 'toolgrpo[ray]'")
    return ray


@pytest.fixture(scope="session")
def ray_cluster():
    """A local cluster for the tier; pools join it (and leave it running when they close)."""
    ray = _import_ray()
    t0 = time.perf_counter()
    ray.init(
        address="local",  # ours, even if another cluster runs on this machine
        num_cpus=RAY_CPUS,
        include_dashboard=False,
        object_store_memory=256 * 1024**2,
        configure_logging=False,
    )
    print(f"\nray.init: {time.perf_counter() - t0:.1f}s")
    yield ray
    ray.shutdown()


def ray_overrides(workers: int = 2, **extra) -> dict[str, str]:
    """Ray mode with small workers: half a CPU each, so a replacement can start while the
    worker it replaces still holds its share."""
    over = {
        "trainer.distributed.backend": "ray",
        "trainer.distributed.num_rollout_workers": str(workers),
        "trainer.distributed.num_cpus_per_worker": "0.5",
        "trainer.num_threads": "1",
    }
    over.update({k: str(v) for k, v in extra.items()})
    return over


# ---- training runs shared by the tier ------------------------------------------------------
# A large step and rewards that vary within a GRPO group (the tiny model's RLLA scores are all
# equal), so the weights visibly move from step to step.
MOVING = {"actor_rollout_ref.actor.optim.lr": "1e-2"}
GREEDY_CHECK = dict(n=1, max_new_tokens=6, do_sample=False)


def varied_score(task, text, step, flags):
    from toolgrpo.rewards.scoring import Score

    v = float(zlib.crc32(text.encode()) % 7) - 3.0
    return Score(v, 0.0, v, 0.0, False, False)


def all_finite(rec: dict) -> None:
    for k, v in rec.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            assert math.isfinite(v), f"{k}={v}"


@dataclass
class Run:
    records: list[dict]
    weights: dict[str, Any]
    greedy: dict[str, list] = field(default_factory=dict)  # remote / trainer / start completions
    versions: set[int] = field(default_factory=set)  # the workers' weight versions at the end


def greedy_views(trainer) -> dict[str, list]:
    """Greedy completions of a few training prompts from the workers, from the trainer's model,
    and from the model as it started (loaded afresh)."""
    from toolgrpo.models.loading import load_policy
    from toolgrpo.rollout.generator import SamplingParams
    from toolgrpo.rollout.hf import HFGenerator
    from toolgrpo.rollout.prompts import render_prompt

    params = SamplingParams(**GREEDY_CHECK)
    prompts = [render_prompt(trainer.tokenizer, t.messages, 4096) for t in trainer.tasks[:3]]
    p = trainer.policy
    fresh = load_policy(trainer.cfg.actor_rollout_ref.model)
    return {
        "remote": trainer.generator.generate(prompts, params),
        "trainer": HFGenerator(p.model, p.tokenizer, p.dtype).generate(prompts, params),
        "start": HFGenerator(fresh.model, fresh.tokenizer, fresh.dtype).generate(prompts, params),
    }


def train(cfg, faults: dict | None = None, inspect: bool = False) -> Run:
    """Train ``cfg`` to the end with varied rewards; ``faults[step] = fn(pool)`` runs as that
    step's rollout starts; ``inspect`` records what the workers hold before the pool closes."""
    from toolgrpo.trainer import rollout_stage
    from toolgrpo.trainer.trainer import Trainer

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(rollout_stage, "score", varied_score)
        trainer = Trainer(cfg)
        try:
            if faults:
                pool, orig = trainer.pool, trainer.pool.generate

                def generate(prompts, params, *policy):
                    hook = faults.pop(trainer.step + 1, None)
                    if hook is not None:
                        hook(pool)
                    return orig(prompts, params, *policy)

                pool.generate = generate
            trainer.fit()
            run = Run(read_metrics(cfg.trainer.output_dir), trainer.policy.model.state_dict())
            if inspect:
                run.greedy = greedy_views(trainer)
                run.versions = {i.version for i in trainer.pool.worker_info()}
            return run
        finally:
            trainer.close()


@pytest.fixture(scope="session")
def clean_run(ray_cluster, tiny_model_dir, tiny_data, tmp_path_factory) -> Run:
    """3 steps of full fine-tuning on 2 workers, nothing broken: the tier's reference run."""
    from toolgrpo.config.loader import load_config
    from toolgrpo.config.schema import TrainConfig

    out = tmp_path_factory.mktemp("clean")
    over = train_overrides(tiny_model_dir, tiny_data, out, 3, **ray_overrides(2), **MOVING)
    return train(load_config(TrainConfig, None, over), inspect=True)
