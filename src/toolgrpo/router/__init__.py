"""Budgeted tool router (issue #4): before each rollout a small head over the prompt's hidden state
picks a route (ANSWER, SEARCH, CALCULATE); the route rewrites the system message; the head is
trained with GRPO on r_task − λ·cost while dual ascent keeps the mean tool cost near a budget B.

Modules: ``routes`` (names), ``families`` (tool families), ``prompts`` (route-conditioned
prompts), ``usage`` (tool usage and cost), ``head`` (the head and prompt features), ``budget``
(λ), ``policy`` (head + optimizer + update), ``runtime`` (the trainer's hook), ``lm_price``
(the λ·cost a step's batch carries for the LM's reward), ``labeler`` (weak labels from an
OpenAI-compatible endpoint), ``infer`` (routing one prompt). The loss and the dual step are pure
functions in ``toolgrpo.algos.router``.
"""
