"""Do the router head's features separate what it must tell apart, before any training?

A cross-validated linear probe (``toolgrpo.router.probe``) of task type and of need-a-tool on the
warm start's features of the held-out tasks of ``configs/router_smollm2.yaml``, for each
``router.inputs`` × ``router.feature_layer`` (final and middle block):

    python benchmarks/router_probe.py        # minutes; writes benchmarks/results/router_probe.json
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))


def probe_warm_start(config: Path, held_out: list[str], out: Path) -> dict[str, Any]:
    """Probe accuracies per input kind and layer on the warm start (no checkpoint)."""
    from toolgrpo.config.loader import load_config
    from toolgrpo.config.schema import TrainConfig
    from toolgrpo.data.loader import load_tasks
    from toolgrpo.envs.arith_mixed import needs_tool
    from toolgrpo.models.loading import load_policy
    from toolgrpo.rewards.types import RllaFlags
    from toolgrpo.router.infer import load_router
    from toolgrpo.router.probe import probe_accuracy
    from toolgrpo.trainer.episodes import make_router

    cfg = load_config(TrainConfig, str(config), [])
    tasks = load_tasks(held_out, "error").tasks
    envs = make_router(cfg, RllaFlags(**vars(cfg.reward.rlla)))
    lm = load_policy(cfg.actor_rollout_ref.model, trainable=False)
    layers = lm.base.config.num_hidden_layers
    types = [t.task_type for t in tasks]
    need = [bool(needs_tool(t)) for t in tasks]
    result: dict[str, Any] = {"config": str(config.relative_to(ROOT)), "tasks": len(tasks)}
    for inputs in ("question", "opening"):
        for layer in (-1, layers // 2):
            cfg.router.inputs, cfg.router.feature_layer = inputs, layer
            head, _ = load_router(cfg, lm, None)
            assert head is not None
            head.read_tasks_with(envs, cfg.data.max_prompt_length)
            feats = head.features_of(tasks)
            got = {
                "task_type": probe_accuracy(feats, types),
                "needs_tool": probe_accuracy(feats, need),
            }
            for t in sorted(set(types)):  # a type where tools help only sometimes: which ones?
                idx = [i for i, x in enumerate(types) if x == t]
                if len({need[i] for i in idx}) == 2:
                    got[f"needs_tool_within_{t}"] = probe_accuracy(
                        feats[idx], [need[i] for i in idx]
                    )
            name = f"{inputs}@layer{layer}"
            result[name] = got
            print(f"probe {name}: " + ", ".join(f"{k} {v:.3f}" for k, v in got.items()), flush=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from router_discrimination import CONFIG, HELD_OUT

    probe_warm_start(CONFIG, HELD_OUT, ROOT / "benchmarks" / "results" / "router_probe.json")
