"""Isolated tools inside a Ray actor (issue 15): the actor's own worker pool stops a runaway
`solve` at its deadline while a cheap call beside it answers."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.ray


def test_isolated_solve_in_a_ray_actor(ray_cluster) -> None:
    ray = ray_cluster

    @ray.remote(num_cpus=0.5)
    class Player:
        def step(self) -> list:
            import asyncio
            import time

            from toolgrpo.data.task import Task
            from toolgrpo.envs.calculator import make_calculator_env
            from toolgrpo.tools import ToolCall

            task = Task("c", ({"role": "user", "content": "q"},), "1", "calculator", "calculator")
            env = make_calculator_env(task, {"timeout_s": 1})
            calls = [
                ToolCall("solve", {"equation": "sin(x)^6 + cos(x)^5 = 1/3"}),
                ToolCall("calculate", {"expression": "1+1"}),
                ToolCall("solve", {"equation": "2x = 6"}),
            ]
            asyncio.run(env.step(calls[2:]))  # the actor's pool starts
            start = time.monotonic()
            results = asyncio.run(env.step(calls))
            return [[r.error_type, r.text] for r in results] + [time.monotonic() - start]

        def close(self) -> None:
            from toolgrpo.tools.shared_pool import shutdown_shared_pool

            shutdown_shared_pool()

    player = Player.remote()
    try:
        *results, took = ray.get(player.step.remote(), timeout=120)
        ray.get(player.close.remote(), timeout=30)
    finally:
        ray.kill(player)
    assert results[0][0] == "timeout" and results[1] == [None, "2"]
    assert results[2] == [None, "x = 3"] and took < 1 + 3, (results, took)
