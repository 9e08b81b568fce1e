"""Two multi-turn GRPO steps with the calculator on each family's tiny model (Qwen3's hermes
calls, Llama 3.1's ``llama3_json``, Gemma 3's hermes in a template without a system role). A
tiny random model writes no call by itself, so its turns are scripted (``FamilyScripted`` in
place of the trainer's generator, as the trainer's other multi-turn tests do): every step
parses calls, runs them, and trains on a token stream with no prefix mismatch."""

from __future__ import annotations

import math

from tests.conftest import read_metrics, train_overrides
from tests.fixtures.families import FamilyScripted
from toolgrpo.config.loader import load_config
from toolgrpo.config.schema import TrainConfig
from toolgrpo.trainer.trainer import Trainer

KEY = "actor_rollout_ref.rollout.multi_turn."
CALLS = {
    "hermes": '<tool_call>\n{"name": "calculate", "arguments": {"expression": "644 * 2"}}\n'
    "</tool_call>",
    "llama3_json": '{"name": "calculate", "parameters": {"expression": "644 * 2"}}',
}
THINK = {"qwen3": "<think>\nI compute it.\n</think>\n\n"}


def test_two_grpo_steps_with_the_calculator(family, tmp_path):
    fam, model_dir, tok = family
    out = tmp_path / "run"
    over = {
        f"{KEY}enable": "true",
        f"{KEY}format": fam.tool_format,
        f"{KEY}envs": "{calculator: {max_turns: 3}}",
        f"{KEY}max_tokens_per_turn": "64",
        "data.max_response_length": "400",
        "data.train_batch_size": "2",
        "actor_rollout_ref.actor.ppo_mini_batch_size": "2",
    }
    ov = train_overrides(model_dir, "calculator:train", out, 2, **over)
    trainer = Trainer(load_config(TrainConfig, None, ov))
    think = THINK.get(fam.name, "")
    turns = [think + CALLS[fam.tool_format], think + "<answer>1288</answer>"]
    trainer.generator = FamilyScripted(tok, fam, turns)
    trainer.fit()
    recs = read_metrics(out)
    assert [r["step"] for r in recs] == [1, 2]
    for r in recs:
        assert r["rollout/prefix_mismatch"] == 0.0
        assert r["episode/tool_calls/mean"] >= 1.0 and r["episode/tool_errors/mean"] == 0.0
        assert r["rollout/env_failures"] == 0.0 and r["batch/size"] == 4
        assert math.isfinite(r["actor/pg_loss"])
