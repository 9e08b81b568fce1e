"""How an episode ends: scored by its environment (its return adds the steps' rewards), or
marked as the environment's failure and left out of training."""

from __future__ import annotations

import logging
from typing import Any

from toolgrpo.envs.base import Env, Transcript
from toolgrpo.rollout.env_calls import EnvClock, failure_reason
from toolgrpo.rollout.episode import Episode
from toolgrpo.rollout.limits import EpisodeLimits
from toolgrpo.rollout.render import decode

log = logging.getLogger(__name__)


def note_slot_wait(ep: Episode, take_slot: Any, clock: EnvClock) -> None:
    """Record how long a capped task type's episode queued for its slot (``Episode.meta``)."""
    if take_slot is not None:
        ep.meta["env_slot_wait_s"] = clock.waited_s


async def finish(
    ep: Episode, env: Env, tokenizer: Any, step: int, limits: EpisodeLimits, clock: EnvClock
) -> Episode:
    """The environment's score of the transcript, plus the sum of the steps' rewards (the
    episode's return; ``reward/step_return`` when any step returned one)."""
    if env.fatal_error:
        return env_failed(ep, env.fatal_error, limits)
    text = decode(tokenizer, ep.prompt_ids + ep.response_ids)
    transcript = Transcript(list(ep.messages), text, ep.stop_reason, ep.num_turns, step)
    try:
        r = await clock.call("reward", env.reward, transcript)
    except Exception as exc:  # a broken reward is the environment's failure, not the model's
        return env_failed(ep, failure_reason("reward", exc), limits)
    if env.fatal_error:  # e.g. the server died while scoring
        return env_failed(ep, env.fatal_error, limits)
    ep.reward, ep.reward_parts = float(r.score) + ep.step_return, dict(r.parts)
    if any(ep.step_rewards):
        ep.reward_parts["step_return"] = ep.step_return
    return ep


def env_failed(ep: Episode, reason: str, limits: EpisodeLimits) -> Episode:
    """Mark an episode its environment failed: ``env_failure`` says why; the trainer leaves it
    out of the batch and of reward means (the score is ``error_reward``, for the record only)."""
    log.debug("episode of %s: environment failed: %s", ep.task_id, reason)
    ep.stop_reason, ep.env_failure = "env_error", reason
    ep.reward, ep.reward_parts = limits.error_reward, {"env_error": 1.0}
    return ep
