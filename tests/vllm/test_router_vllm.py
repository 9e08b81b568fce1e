"""A router run sampled by vLLM: one step of multi-turn episodes on calculator, search and direct
tasks (routes rewrite the system prompt and the tools offered), then the step's routed validation
on the shared engine: the served head's budget offset fit on the training tasks under every
route, and every validation task played under every route. What CPU runs of the shipped router
config do on vLLM, small."""

from __future__ import annotations

import math

import pytest

from tests.conftest import env_task_file, read_metrics
from tests.vllm.conftest import vllm_train_overrides

pytestmark = pytest.mark.vllm


def test_router_validation_fits_the_offset_and_plays_every_route_on_vllm(session_gen, tmp_path):
    from toolgrpo.config.loader import load_config
    from toolgrpo.config.schema import TrainConfig
    from toolgrpo.models.safe_load import load_torch_file
    from toolgrpo.rollout.vllm_backend import VLLMGenerator
    from toolgrpo.router.offset import OFFSET_KEY, AnswerOffset
    from toolgrpo.trainer.trainer import Trainer

    data = env_task_file(tmp_path / "env.jsonl", 1)
    ov = vllm_train_overrides(
        data,
        tmp_path / "run",
        **{
            "actor_rollout_ref.model.path": "smollm2-135m-agent",
            "data.max_prompt_length": "900",
            "data.max_response_length": "32",
            "actor_rollout_ref.rollout.multi_turn.enable": "true",
            "actor_rollout_ref.rollout.multi_turn.max_tokens_per_turn": "16",
            "actor_rollout_ref.rollout.generation_batch_size": "4",
            "router.enable": "true",
            "trainer.test_freq": "1",
            "trainer.save_freq": "1",
        },
    )
    ov = [x for x in ov if not x.startswith("trainer.total_training_steps=")]
    trainer = Trainer(load_config(TrainConfig, None, [*ov, "trainer.total_training_steps=1"]))
    try:
        assert isinstance(trainer.generator, VLLMGenerator)
        assert trainer.generator.llm is session_gen.llm  # the session's engine, shared
        trainer.fit()
    finally:
        trainer.close()
    (rec,) = read_metrics(tmp_path / "run")
    assert rec["step"] == 1 and math.isfinite(rec["router/lambda"])
    # the fit: the 3 training tasks under every route; then every route of each validation task
    assert rec["val/router_offset/tasks"] == 3 and rec["val/router_offset/feasible"] == 1.0
    shares = [rec[f"val/route_share/all/{r}"] for r in ("ANSWER", "SEARCH", "CALCULATE")]
    assert sum(shares) == pytest.approx(1.0)
    for baseline in ("always_answer", "always_family", "best_in_hindsight"):
        assert math.isfinite(rec[f"val/baseline/{baseline}/all/reward_mean"]), baseline
    state = load_torch_file(tmp_path / "run" / "checkpoints" / "global_step_1" / "router.pt")
    saved = AnswerOffset.from_state(state[OFFSET_KEY])
    assert saved is not None and saved.step == 1 and saved.tasks == 3
    assert saved.delta == pytest.approx(rec["val/router_offset/delta"])
    if saved.feasible and (saved.binding or saved.spend_before > saved.budget):
        assert saved.spend == pytest.approx(saved.budget, abs=1e-6)
