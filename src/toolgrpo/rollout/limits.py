"""An episode's bounds: prompt and response budgets, deadlines, the tool-call format."""

from __future__ import annotations

from dataclasses import dataclass

from toolgrpo.rollout.tool_parsers import get_format


@dataclass(frozen=True)
class EpisodeLimits:
    max_prompt_length: int = 1024  # the opening prompt
    max_response_length: int = 512  # all turns after the prompt, tool results included
    max_tokens_per_turn: int = 256  # one assistant turn
    max_tool_response_length: int = 256  # tokens of one tool result (0 = no limit)
    tool_response_truncate_side: str = "middle"  # right | left | middle
    # The score recorded on an episode whose environment failed; such episodes are never trained
    # on nor averaged into reward metrics (``Episode.env_failure``), so it is informational.
    error_reward: float = -1.0
    # Deadlines (``env_calls.EnvClock``): one environment call, and all of an episode's calls
    # together (generation not counted); past either, an environment failure. 0 = no limit.
    # Waiting for a ``max_concurrency`` slot spends only the episode's budget, not a call's.
    # The environment's construction has the call deadline too.
    env_call_timeout_s: float = 60.0
    env_episode_timeout_s: float = 900.0
    # How the model writes tool calls (``rollout.tool_parsers``): a registered format's name.
    tool_format: str = "hermes"

    def __post_init__(self) -> None:
        get_format(self.tool_format)  # an unknown format fails here, not mid-rollout
