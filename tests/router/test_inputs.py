"""What the router head reads: the environment's opening (system prompt, tools, question), once
per task; or the bare question."""

from __future__ import annotations

from toolgrpo.config.schema import ModelConfig
from toolgrpo.data.task import Task
from toolgrpo.envs.registry import EnvRouter
from toolgrpo.models.loading import load_policy
from toolgrpo.rollout.prompts import render_prompt
from toolgrpo.router.inputs import RouterInputs


def _task(i: int, kind: str = "calculator") -> Task:
    q = f"What is {i} * 37?"
    return Task(f"t{i}", ({"role": "user", "content": q},), str(i * 37), kind, kind)


class CountingRouter(EnvRouter):
    def __init__(self) -> None:
        super().__init__()
        self.opened = 0

    def make(self, task):
        self.opened += 1
        return super().make(task)


def test_the_opening_carries_the_system_prompt_and_tools_and_is_cached(tiny_model_dir):
    tok = load_policy(ModelConfig(path=str(tiny_model_dir), dtype="float32"), trainable=False)
    tok = tok.tokenizer
    envs = CountingRouter()
    inputs = RouterInputs(tok, 4096, envs, "opening")
    tasks = [_task(1), _task(2), _task(1)]
    ids = inputs(tasks)
    text = tok.decode(ids[0])
    assert "What is 1 * 37?" in text and "calculate" in text  # the tool list is there
    assert ids[0] == ids[2] and ids[0] != ids[1]
    assert envs.opened == 2  # the repeated task opened once
    inputs(tasks)
    assert envs.opened == 2  # and never again
    question = RouterInputs(tok, 4096, envs, "question")(tasks[:1])
    assert question == [render_prompt(tok, tasks[0].messages, 4096, "left")]
    assert len(question[0]) < len(ids[0])
    short = RouterInputs(tok, 16, envs, "opening")(tasks[:1])[0]
    assert short == ids[0][-16:]  # left-truncated, as the episode's prompt is


def test_an_environment_that_cannot_open_falls_back_to_the_question(tiny_model_dir):
    tok = load_policy(ModelConfig(path=str(tiny_model_dir), dtype="float32"), trainable=False)
    tok = tok.tokenizer
    bad = Task("x", ({"role": "user", "content": "hi"},), "1", "nope", "no_such_env")
    got = RouterInputs(tok, 4096, EnvRouter(), "opening")([bad])
    assert got == [render_prompt(tok, bad.messages, 4096, "left")]
