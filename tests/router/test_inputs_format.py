"""The router head reads openings in the run's tool-call format (``multi_turn.format``), as the
model sees them; a head records a non-default format in its meta and reads tasks with it."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
import torch

from toolgrpo.config.loader import load_config
from toolgrpo.config.schema import TrainConfig
from toolgrpo.data.task import Task
from toolgrpo.envs.registry import EnvRouter
from toolgrpo.models.loading import load_tokenizer
from toolgrpo.rollout.render import encode, render_text, template_supports_tools, with_tools
from toolgrpo.rollout.tool_parsers import get_format
from toolgrpo.router.infer import ROUTER_FILE, load_router
from toolgrpo.router.inputs import RouterInputs
from toolgrpo.router.policy import RouterPolicy

QUESTION = {"role": "user", "content": "What is 1 * 37?"}
TASK = Task("t1", (QUESTION,), "37", "calculator", "calculator")
ROUTES = ["ANSWER", "CALCULATE"]


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return load_tokenizer(tiny_model_dir)


def _lm(tok):
    return SimpleNamespace(
        base=SimpleNamespace(config=SimpleNamespace(hidden_size=4)), tokenizer=tok
    )


@pytest.mark.parametrize("fmt", ["hermes", "llama3_json", "mistral"])
def test_the_opening_lists_tools_with_the_formats_instructions(tok, fmt):
    assert not template_supports_tools(tok)  # ChatML: the tools go in the system message
    (ids,) = RouterInputs(tok, 4096, EnvRouter(), "opening", fmt)([TASK])
    start = asyncio.run(EnvRouter().make(TASK).reset())
    messages, spec = with_tools(tok, start.messages, start.tools, fmt)
    assert ids == encode(tok, render_text(tok, messages, spec, True))  # what the episode opens
    text = tok.decode(ids)
    assert get_format(fmt).how_to_call in text and "calculate" in text
    assert (get_format("hermes").how_to_call in text) == (fmt == "hermes")
    if fmt == "hermes":  # the default is what the head always read
        assert RouterInputs(tok, 4096, EnvRouter(), "opening")([TASK]) == [ids]


def test_an_unknown_format_is_refused_up_front(tok):
    with pytest.raises(ValueError, match="unknown tool-call format"):
        RouterInputs(tok, 4096, EnvRouter(), "opening", "xml")


def test_the_head_reads_and_records_its_format(tok):
    hermes = RouterPolicy(_lm(tok), ROUTES)
    assert set(hermes.meta) == {
        "routes",
        "pooling",
        "feature_layer",
        "inputs",
        "hidden_size",
        "head_hidden",
        "feature_norm",
    }  # a hermes head's meta is what it always was
    mistral = RouterPolicy(_lm(tok), ROUTES, tool_format="mistral")
    assert mistral.meta["tool_format"] == "mistral"
    mistral.read_tasks_with(EnvRouter(), 4096)
    want = RouterInputs(tok, 4096, EnvRouter(), "opening", "mistral")([TASK])
    assert mistral.prompt_source([TASK]) == want
    with pytest.raises(ValueError, match="tool_format='mistral'"):
        RouterPolicy(_lm(tok), ROUTES).load_state_dict(mistral.state_dict())
    with pytest.raises(ValueError, match="tool_format='hermes'"):
        RouterPolicy(_lm(tok), ROUTES, tool_format="mistral").load_state_dict(hermes.state_dict())
    RouterPolicy(_lm(tok), ROUTES).load_state_dict(hermes.state_dict())


def test_load_router_takes_the_runs_format_or_the_checkpoints(tok, tiny_model_dir, tmp_path):
    overrides = [
        f"actor_rollout_ref.model.path={tiny_model_dir}",
        "actor_rollout_ref.rollout.multi_turn.format=llama3_json",
        "router.enable=true",
        f"router.routes=[{','.join(ROUTES)}]",
    ]
    cfg = load_config(TrainConfig, None, overrides)
    fresh, is_fresh = load_router(cfg, _lm(tok), None)
    assert is_fresh and fresh.tool_format == "llama3_json"
    saved = RouterPolicy(_lm(tok), ROUTES, tool_format="mistral")
    torch.save(saved.state_dict(), tmp_path / ROUTER_FILE)
    loaded, is_fresh = load_router(cfg, _lm(tok), str(tmp_path))
    assert not is_fresh and loaded.tool_format == "mistral"  # as it was trained to read
