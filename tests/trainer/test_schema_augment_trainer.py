"""Schema augmentation in the trainer: training episodes offer renamed tools (a model that reads
the offered example call runs it without an error), validation episodes the tools' own names."""

from __future__ import annotations

import re
from dataclasses import dataclass

from transformers import AutoTokenizer

from tests.conftest import read_metrics
from tests.rollout.test_multi_turn import ScriptedGenerator
from toolgrpo.trainer.trainer import Trainer

KEY = "actor_rollout_ref.rollout.multi_turn."
EXAMPLE = re.compile(r"<tool_call>(\{.*?\})</tool_call>")


@dataclass
class ReadsTheExample(ScriptedGenerator):
    """First turn: the call the system prompt shows (under the names it offers); then answers."""

    def generate(self, prompts, params):
        out = super().generate(prompts, params)
        for c in out:
            if self._turn_of(c.prompt_ids) == 0:
                text = self.tokenizer.decode(c.prompt_ids, skip_special_tokens=False)
                call = f"<tool_call>{EXAMPLE.search(text).group(1)}</tool_call>"
                ids = self.tokenizer(call, add_special_tokens=False)["input_ids"]
                c.token_ids = list(ids) + self.eos_ids
                c.logprobs = [-0.01] * len(c.token_ids)
        return out


def test_training_offers_renamed_tools_and_validation_their_own(
    make_train_config, tmp_path, tiny_model_dir
):
    cfg = {
        f"{KEY}enable": "true",
        f"{KEY}envs": "{calculator: {max_turns: 3}}",
        f"{KEY}schema_augmentation.enable": "true",
        f"{KEY}schema_augmentation.prob": "1.0",
        "data.max_response_length": "300",
        "trainer.val_before_train": "true",
        "trainer.test_freq": "1",
        "data.max_samples": "2",
    }
    out = tmp_path / "run"
    trainer = Trainer(make_train_config(steps=1, out=out, data="calculator:train", **cfg))
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    scripted = ReadsTheExample(tok, ["", "<answer>1</answer>"])
    trainer.generator = trainer.episodes.generator = scripted  # training's and validation's
    played = []
    play = trainer.episodes.play

    def watch(tasks, params, step, version, *args, **kw):
        eps = play(tasks, params, step, version, *args, **kw)
        training = kw.get("rollback", args[1] if len(args) > 1 else True)
        played.append((training, [e.messages[0]["content"] for e in eps]))
        return eps

    trainer.episodes.play = watch
    trainer.fit()
    calls = [EXAMPLE.search(s).group(1) for t, systems in played if t for s in systems]
    val = [EXAMPLE.search(s).group(1) for t, systems in played if not t for s in systems]
    assert calls and val
    assert all('"calculate"' in c and '"expression"' in c for c in val)
    assert sum('"calculate"' not in c for c in calls) > len(calls) // 2
    for r in read_metrics(out):
        if "episode/tool_calls/mean" in r:  # the training steps: every offered call ran
            assert r["episode/tool_calls/mean"] >= 1.0 and r["episode/tool_errors/mean"] == 0.0
