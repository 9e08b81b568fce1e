"""toolgrpo: reinforcement learning (GRPO/PPO) for tool-using language models."""

__version__ = "0.1.0"
