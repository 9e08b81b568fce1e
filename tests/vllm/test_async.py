"""``rollout.mode=async``: vLLM's async engine (its core in a child process) samples with the same
log-probs as HF, takes weight pushes through a file and the worker extension (tied head
included), serves multi-turn episodes one request per turn, and trains. One engine for the
module (same settings as the trainer test's, so the trainer shares it)."""

from __future__ import annotations

import asyncio
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import read_metrics
from tests.vllm.conftest import (
    BASE_VERSION,
    ENGINE_OVERRIDES,
    perturbed,
    recompute,
    vllm_train_overrides,
)
from toolgrpo.rollout.generator import GenerationError, SamplingParams

pytestmark = pytest.mark.vllm

ATOL = 1e-3


@pytest.fixture(scope="module")
def async_cfg(engine_cfg):
    from toolgrpo.config.loader import load_config
    from toolgrpo.config.schema import TrainConfig

    overrides = {
        "actor_rollout_ref.model.path": "smollm2-135m",
        "actor_rollout_ref.rollout.name": "vllm",
        "actor_rollout_ref.rollout.mode": "async",
        **ENGINE_OVERRIDES,
    }
    return load_config(TrainConfig, None, [f"{k}={v}" for k, v in overrides.items()])


@pytest.fixture(scope="module")
def module_agen(async_cfg, hf_policy):
    """Built with 1 torch thread here (as ``trainer.num_threads=1`` would set), which the engine
    process should take unless OMP_NUM_THREADS says otherwise."""
    from toolgrpo.rollout.backends import make_generator
    from toolgrpo.rollout.vllm_async import AsyncVLLMGenerator

    threads, env = torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")
    torch.set_num_threads(1)
    try:
        gen = make_generator(async_cfg, hf_policy)
    finally:
        torch.set_num_threads(threads)
    assert isinstance(gen, AsyncVLLMGenerator)
    assert os.environ.get("OMP_NUM_THREADS") == env  # set for the spawn only
    yield gen
    gen.close()


def test_the_engine_process_takes_the_creators_thread_count(module_agen):
    eng = module_agen._live()
    assert eng.engine_pid > 0 and eng.engine_pid != os.getpid()
    assert eng.engine_threads == int(os.environ.get("OMP_NUM_THREADS", "1"))


@pytest.fixture
def agen(module_agen, hf_policy):
    module_agen.sync_weights(hf_policy.model, BASE_VERSION)
    return module_agen


def _check_against_hf(model, comps, **warp) -> None:
    for c in comps:
        assert c.token_ids and len(c.logprobs) == len(c.token_ids)
        want = recompute(model, c, **warp)[0]
        torch.testing.assert_close(torch.tensor(c.logprobs), want, rtol=0, atol=ATOL)


def test_generate_and_agenerate_match_hf_logprobs(agen, hf_policy, prompts):
    torch.manual_seed(3)
    out = agen.generate(prompts, SamplingParams(n=2, max_new_tokens=12))
    assert [c.prompt_index for c in out] == [0, 0, 1, 1, 2, 2]
    assert all(c.prompt_ids == prompts[c.prompt_index] for c in out)
    _check_against_hf(hf_policy.model, out)

    params = SamplingParams(temperature=0.7, top_k=20, max_new_tokens=12)

    async def concurrently():
        return await asyncio.gather(*(agen.agenerate(p, params) for p in prompts))

    torch.manual_seed(3)
    groups = asyncio.run(concurrently())
    assert [len(g) for g in groups] == [1, 1, 1]
    _check_against_hf(hf_policy.model, [g[0] for g in groups], temperature=0.7, top_k=20)
    # Stop strings as in sync mode (greedy: "Paris" is the answer's first content word).
    (cut,) = agen.generate(
        prompts[:1], SamplingParams(do_sample=False, max_new_tokens=32, stop=("Paris",))
    )
    assert cut.finish_reason == "stop"
    assert hf_policy.tokenizer.decode(cut.token_ids).endswith("Paris")
    # Seeds come from torch's RNG: the same seed replays the same samples.
    torch.manual_seed(3)
    again = asyncio.run(concurrently())
    assert [g[0].token_ids for g in again] == [g[0].token_ids for g in groups]


def test_weight_push_lands_including_the_tied_head_and_restores(agen, hf_policy, prompts):
    model = hf_policy.model
    greedy = SamplingParams(do_sample=False, max_new_tokens=8)
    base = agen.generate(prompts, greedy)
    with perturbed(model, ["model.embed_tokens.weight"], scale=0.5, seed=1):
        agen.sync_weights(model, 1)
        assert agen.last_sync_s > 0
        torch.manual_seed(5)
        out = agen.generate(prompts, SamplingParams(max_new_tokens=8))
        pushed = [recompute(model, c)[0] for c in out]
    before = [recompute(model, c)[0] for c in out]
    moved = 0.0
    for c, want, old in zip(out, pushed, before, strict=True):
        torch.testing.assert_close(torch.tensor(c.logprobs), want, rtol=0, atol=ATOL)
        moved = max(moved, float((want - old).abs().max()))
    assert moved > 0.05, f"the perturbation barely moved the log-probs ({moved})"
    syncs = agen.syncs
    agen.sync_weights(model, BASE_VERSION)
    assert agen.syncs == syncs + 1
    restored = agen.generate(prompts, greedy)
    assert [c.token_ids for c in restored] == [c.token_ids for c in base]


def test_multi_turn_episodes_go_one_request_per_turn(agen, hf_policy):
    from tests.vllm.test_multi_turn import FOLLOW_UP  # registers calculator_follow_up
    from toolgrpo.data.task import Task
    from toolgrpo.envs.registry import EnvRouter
    from toolgrpo.models.logprobs import response_logprobs
    from toolgrpo.rollout.batcher import GenerationBatcher
    from toolgrpo.rollout.multi_turn import EpisodeLimits, play_tasks

    tok = hf_policy.tokenizer
    question = "What is 2+2? Reply with just <answer>4</answer>."
    tasks = [Task("c#0", ({"role": "user", "content": question},), "4", "calculator", "calculator")]
    router = EnvRouter({"calculator": {"type": "calculator_follow_up", "max_turns": 3}})
    limits = EpisodeLimits(max_prompt_length=900, max_response_length=120, max_tokens_per_turn=24)
    batcher = GenerationBatcher(agen, SamplingParams(do_sample=False, max_new_tokens=24))
    try:
        episodes = asyncio.run(play_tasks(tasks, 2, router, batcher, tok, limits))
    finally:
        batcher.close()
    turns = sum(ep.num_turns for ep in episodes)
    assert batcher.calls == batcher.requests == turns  # no waves: each turn its own request
    for ep in episodes:
        assert ep.stop_reason != "env_error" and ep.prefix_mismatches == 0
        assert ep.num_turns >= 2 and FOLLOW_UP in tok.decode(ep.response_ids)
        ids = torch.tensor([ep.prompt_ids + ep.response_ids])
        with torch.no_grad():
            want = response_logprobs(
                hf_policy.model, ids, torch.ones_like(ids), len(ep.response_ids)
            ).logprobs_BR[0]
        mask = torch.tensor(ep.response_mask, dtype=torch.bool)
        torch.testing.assert_close(torch.tensor(ep.logprobs)[mask], want[mask], rtol=0, atol=ATOL)


def test_a_refused_request_stops_the_episodes_with_a_clear_error(agen, hf_policy):
    """A prompt the engine cannot extend is a setup error: it surfaces, it is not scored."""
    from toolgrpo.rollout.batcher import GenerationBatcher

    batcher = GenerationBatcher(agen, SamplingParams(max_new_tokens=4))
    too_long = [1] * agen.max_model_len
    try:
        with pytest.raises(GenerationError, match="max_model_len"):
            asyncio.run(batcher.generate(too_long, 4))
    finally:
        batcher.close()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return "\nState:\tZ" not in f.read()  # a zombie has exited
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl(PR_SET_PDEATHSIG)")
def test_the_engine_process_dies_with_a_killed_trainer():
    """vLLM's engine core outlives a SIGKILLed parent (2.6 GB left running, seen by hand);
    toolgrpo binds it to die with the process that started it."""
    root = Path(__file__).resolve().parents[2]
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.vllm.engine_child"],
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seen: list[str] = []
    pid = 0
    try:
        assert child.stdout is not None
        for line in child.stdout:
            seen = [*seen[-19:], line]
            if line.startswith("ENGINE "):
                pid = int(line.split()[1])
                break
        assert pid > 0 and _alive(pid), "no live engine pid from the child:\n" + "".join(seen)
    finally:
        child.kill()
        child.wait(timeout=30)
    deadline = time.time() + 30
    while _alive(pid) and time.time() < deadline:
        time.sleep(0.5)
    assert not _alive(pid), f"engine process {pid} outlived its killed parent"


def test_two_grpo_steps_with_the_async_engine(module_agen, tiny_data, tmp_path):
    from toolgrpo.config.loader import load_config
    from toolgrpo.config.schema import TrainConfig
    from toolgrpo.rollout.vllm_async import AsyncVLLMGenerator
    from toolgrpo.trainer.trainer import Trainer

    out = tmp_path / "run"
    overrides = vllm_train_overrides(
        tiny_data,
        out,
        **{
            "actor_rollout_ref.rollout.mode": "async",
            "actor_rollout_ref.rollout.multi_turn.enable": "true",  # episodes via the batcher
        },
    )
    trainer = Trainer(load_config(TrainConfig, None, overrides))
    try:
        gen = trainer.generator
        assert isinstance(gen, AsyncVLLMGenerator)
        assert gen._live() is module_agen._live()  # same settings: one engine process
        trainer.fit()
        recs = read_metrics(out)
        assert [r["step"] for r in recs] == [1, 2]
        for r in recs:
            for key in ("reward/mean", "actor/pg_loss", "timing/weight_sync_s"):
                assert math.isfinite(r[key]), key
            assert r["rollout/logprob_diff_mean"] < 1e-3  # the engine samples the actor
        assert gen.syncs == 3  # the warm start's adapter, then after each update
    finally:
        trainer.close()
    assert gen._engine is None and module_agen._live().llm is not None
