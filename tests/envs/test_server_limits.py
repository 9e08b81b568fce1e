"""serve-env's limits and secrets: idle sessions, a session cap, startup checks, no API docs, the
token kept out of argv and run files, and the answer kept from the environment until scoring.

Issue 14 item 9 and issue 15 item 10; each test names the defect it pins.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from websockets.asyncio.client import connect

from tests.envs.server_thread import serve_in_thread
from toolgrpo.config.loader import load_config, to_yaml
from toolgrpo.config.schema import TrainConfig, as_dict
from toolgrpo.data.task import Task
from toolgrpo.envs import server as server_mod
from toolgrpo.envs.base import Env, EnvReward, EnvStart, Transcript
from toolgrpo.envs.registry import EnvConfigError, register_env
from toolgrpo.envs.remote import RemoteEnv, RemoteOptions
from toolgrpo.envs.server import create_app, parse_options, read_token
from toolgrpo.tools.types import ToolCall, ToolResult

ROOT = Path(__file__).resolve().parents[2]
GT_ENV = "gt_spy_test"
GT_EARLY_ENV = "gt_early_spy_test"


@register_env(GT_ENV)
class GroundTruthSpyEnv(Env):
    """Records the answer it saw at reset; scores 1 when the answer is in the transcript."""

    max_turns = 2
    seen_at_reset: list[str] = []

    def __init__(self, task: Task, options: Mapping[str, Any]) -> None:
        self.task = task

    async def reset(self) -> EnvStart:
        type(self).seen_at_reset.append(self.task.ground_truth)
        return EnvStart(list(self.task.messages), [])

    async def step(self, calls: list[ToolCall]) -> list[ToolResult]:
        return [ToolResult("ok", name=c.name, call_id=c.id) for c in calls]

    async def reward(self, t: Transcript) -> EnvReward:
        return EnvReward(float(bool(self.task.ground_truth) and self.task.ground_truth in t.text))


@register_env(GT_EARLY_ENV)
class EarlyGroundTruthSpyEnv(GroundTruthSpyEnv):
    needs_ground_truth_at_reset = True
    seen_at_reset: list[str] = []


def make_task(i: int = 0, task_type: str = "spy") -> Task:
    msgs = ({"role": "user", "content": f"what is {i}?"},)
    meta = {"index": i, "output_sft": f"worked solution: answer-{i}"}
    return Task(f"t{i}", msgs, f"answer-{i}", task_type=task_type, meta=meta)


@contextmanager
def thread_server(env_type: str = GT_ENV, token: str | None = None, **limits: Any) -> Iterator[str]:
    """``env_type`` served in a thread with ``create_app``'s limits; yields the ws:// URL."""
    with serve_in_thread(env_type, {}, token, **limits) as url:
        yield url


def http(ws_url: str) -> str:
    return ws_url.replace("ws://", "http://").removesuffix("/ws")


def remote(url: str, task: Task | None = None, **opts: Any) -> RemoteEnv:
    return RemoteEnv(task or make_task(), RemoteOptions.parse({"url": url, **opts}))


def _spy_frames(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    frames: list[dict[str, Any]] = []
    handle = server_mod._Session.handle

    async def spy(self: Any, raw: str) -> dict[str, Any]:
        frames.append(json.loads(raw))
        return await handle(self, raw)

    monkeypatch.setattr(server_mod._Session, "handle", spy)
    return frames


async def _score(env: RemoteEnv, text: str) -> EnvReward:
    await env.reset()
    reward = await env.reward(Transcript([], text, "answer", 1))
    await env.close()
    return reward


# ---- issue 14 item 9: the answer stays with the trainer ---------------------------------------


def test_reset_sends_no_ground_truth_and_reward_still_scores(monkeypatch) -> None:
    """Defect: RemoteEnv.reset sent the task's ground truth to the environment server, so the
    served env (and its tools) knew the answer during the episode."""
    frames = _spy_frames(monkeypatch)
    GroundTruthSpyEnv.seen_at_reset.clear()
    with thread_server() as u:
        hit = asyncio.run(_score(remote(u, make_task(1)), "so it is answer-1"))
        miss = asyncio.run(_score(remote(u, make_task(2)), "so it is answer-1"))
    resets = [f for f in frames if f["op"] == "reset"]
    assert len(resets) == 2 and all("ground_truth" not in f["task"] for f in resets)
    assert "answer-1" not in json.dumps(resets)  # nor the reference solution in meta
    assert resets[0]["task"]["meta"] == {"index": 1}
    assert GroundTruthSpyEnv.seen_at_reset == ["", ""]
    rewards = [f for f in frames if f["op"] == "reward"]
    assert [f["ground_truth"] for f in rewards] == ["answer-1", "answer-2"]
    assert (hit.score, miss.score) == (1.0, 0.0)


def test_env_that_declares_it_gets_ground_truth_at_reset(monkeypatch) -> None:
    """An environment that needs the answer from the start (BFCL runs the reference calls turn
    by turn) declares ``needs_ground_truth_at_reset`` and gets it with the task."""
    frames = _spy_frames(monkeypatch)
    EarlyGroundTruthSpyEnv.seen_at_reset.clear()
    with thread_server(GT_EARLY_ENV) as u:
        reward = asyncio.run(_score(remote(u, make_task(3)), "answer-3"))
        info = httpx.get(http(u) + "/info").json()
    assert EarlyGroundTruthSpyEnv.seen_at_reset == ["answer-3"] and reward.score == 1.0
    assert [f["task"]["ground_truth"] for f in frames if f["op"] == "reset"] == ["answer-3"]
    assert all("ground_truth" not in f for f in frames if f["op"] == "reward")
    assert info["ground_truth_at"] == "reset"
    from toolgrpo.envs.bfcl import make_bfcl_env
    from toolgrpo.envs.server import needs_ground_truth_at_reset

    assert needs_ground_truth_at_reset(make_bfcl_env)


def test_served_calculator_scores_with_the_answer_sent_at_reward() -> None:
    """A built-in env reads the answer when scoring, so withholding it at reset keeps rewards."""
    task = Task("c1", ({"role": "user", "content": "6*7?"},), "42", task_type="calculator")
    msgs = [{"role": "assistant", "content": "<answer>42</answer>"}]

    async def go(url: str) -> tuple[float, float]:
        scores = []
        for t in (task, replace(task, ground_truth="41")):
            env = remote(url, t)
            await env.reset()
            scores.append((await env.reward(Transcript(msgs, "", "answer", 1))).score)
            await env.close()
        return scores[0], scores[1]

    with thread_server("calculator") as u:
        assert asyncio.run(go(u)) == (1.0, 0.0)


# ---- issue 15 item 10: serve-env limits and secrets -------------------------------------------


def test_idle_sessions_are_closed() -> None:
    """Defect: a client that opened a session and went quiet held its env forever."""
    with thread_server(idle_timeout_s=0.3) as u:

        async def go() -> tuple[list[ToolResult], str | None]:
            env = remote(u)
            await env.reset()
            await asyncio.sleep(1.0)
            results = await env.step([ToolCall("x", {}, id="c")])
            await env.close()
            return results, env.fatal_error

        results, fatal = asyncio.run(go())
        sessions = httpx.get(http(u) + "/info").json()["sessions"]
    assert results[0].error_type == "transport" and fatal and "connection lost" in fatal
    assert sessions == 0


def test_sessions_are_capped_with_a_clear_refusal() -> None:
    """Defect: serve-env accepted any number of sessions (one env each)."""
    with thread_server(max_sessions=2) as u:

        async def go() -> tuple[str | None, str | None, str | None]:
            held = [remote(u, make_task(i)) for i in range(2)]
            for env in held:
                await env.reset()
            third = remote(u, make_task(9))
            await third.reset()
            await held[0].close()
            await asyncio.sleep(0.2)  # the server notices the close
            fourth = remote(u, make_task(8))
            await fourth.reset()
            for env in (*held, third, fourth):
                await env.close()
            return held[1].fatal_error, third.fatal_error, fourth.fatal_error

        kept, refused, after = asyncio.run(go())
    assert kept is None and after is None
    assert refused is not None and "HTTP 503" in refused and "session limit" in refused


def test_no_api_docs_and_case_insensitive_scheme() -> None:
    """Defects: /openapi.json was served without the token (listing every route); a client
    sending ``bearer <token>`` (scheme in lower case, valid per RFC 7235) was refused."""
    with thread_server(token="s3cret") as u:
        for path in ("/openapi.json", "/docs", "/redoc"):
            for headers in ({}, {"Authorization": "Bearer s3cret"}):
                assert httpx.get(http(u) + path, headers=headers).status_code == 404
        for scheme in ("Bearer", "bearer", "BEARER"):
            got = httpx.get(http(u) + "/info", headers={"Authorization": f"{scheme} s3cret"})
            assert got.status_code == 200
        for bad in ("Basic s3cret", "Bearer S3CRET", "Bearers3cret", "s3cret"):
            assert httpx.get(http(u) + "/info", headers={"Authorization": bad}).status_code == 401

        async def lower_case_handshake() -> str:
            async with connect(u, additional_headers={"Authorization": "bearer s3cret"}) as ws:
                await ws.send(json.dumps({"op": "reset", "task": {"task_id": 1, "messages": []}}))
                return json.loads(await ws.recv())["op"]

        assert asyncio.run(lower_case_handshake()) == "start"


def _never_serve(monkeypatch: pytest.MonkeyPatch) -> None:
    def run(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("serve-env started serving despite bad input")

    monkeypatch.setattr(uvicorn, "run", run)


def test_startup_checks_of_options_port_and_limits(capsys, monkeypatch) -> None:
    """Defect: bad --option / --port values were accepted and failed later (or never)."""
    from toolgrpo.cli import main

    _never_serve(monkeypatch)

    with pytest.raises(EnvConfigError, match="unknown calculator option"):
        create_app("calculator", {"timeout": 3})
    create_app("calculator", {"timeout_s": 3})  # a known option
    for bad in (["noequals"], ["=3"], ["a b=1"], ["k=1", "k=2"]):
        with pytest.raises(ValueError, match="--option"):
            parse_options(bad)
    for kw in ({"idle_timeout_s": 0}, {"max_sessions": 0}):
        with pytest.raises(ValueError):
            create_app("calculator", {}, **kw)
    for argv, want in [
        (["--port", "0"], "1..65535"),
        (["--port", "70000"], "1..65535"),
        (["--option", "timeout=3"], "unknown calculator option"),
        (["--option", "broken"], "KEY=VALUE"),
        (["--max-sessions", "0"], "max-sessions"),
    ]:
        assert main(["serve-env", "calculator", *argv]) == 2
        err = capsys.readouterr().err
        assert want in err and len(err.strip().splitlines()) == 1, err


def test_token_not_on_the_command_line(tmp_path, monkeypatch, capsys) -> None:
    """Defect: the token could only be given as --token (readable by anyone in the process
    list) or the environment; --token is now refused with what to use instead."""
    from toolgrpo.cli import main

    _never_serve(monkeypatch)
    monkeypatch.delenv("TOOLGRPO_ENV_TOKEN", raising=False)
    assert main(["serve-env", "calculator", "--token", "s3cret"]) == 2
    err = capsys.readouterr().err
    assert "TOOLGRPO_ENV_TOKEN" in err and "--token-file" in err and "s3cret" not in err
    empty = tmp_path / "empty"
    empty.write_text("\n")
    for path, want in ((empty, "is empty"), (tmp_path / "missing", "cannot read")):
        assert main(["serve-env", "calculator", "--token-file", str(path)]) == 2
        assert want in capsys.readouterr().err
    good = tmp_path / "tok"
    good.write_text("s3cret\n")
    assert read_token(str(good)) == "s3cret"
    monkeypatch.setenv("TOOLGRPO_ENV_TOKEN", "from-env")
    assert read_token(None) == "from-env"


def test_token_file_server_keeps_token_out_of_argv(tmp_path) -> None:
    """The served token comes from a file: it authorizes, and /proc/<pid>/cmdline lacks it."""
    token = "t0k-" + os.urandom(6).hex()
    tok = tmp_path / "token"
    tok.write_text(token)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "toolgrpo.cli", "serve-env", "calculator"]
    cmd += ["--port", str(port), "--token-file", str(tok)]
    env = {k: v for k, v in os.environ.items() if k != "TOOLGRPO_ENV_TOKEN"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, "serve-env exited"
            try:
                if httpx.get(base + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "serve-env did not come up"
            time.sleep(0.1)
        assert httpx.get(base + "/info").status_code == 401
        auth = {"Authorization": f"Bearer {token}"}
        assert httpx.get(base + "/info", headers=auth).status_code == 200
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
        assert token.encode() not in cmdline
    finally:
        proc.kill()
        proc.wait(10)


def test_client_token_file_and_env(tmp_path, monkeypatch) -> None:
    """The client reads its token from ``token_file`` or ``token_env`` (not only a literal)."""
    tok = tmp_path / "token"
    tok.write_text("s3cret\n")
    assert RemoteOptions.parse({"url": "ws://h/ws", "token_file": str(tok)}).token == "s3cret"
    monkeypatch.setenv("MY_TEST_TOKEN", "from-env")
    assert RemoteOptions.parse({"url": "ws://h/ws", "token_env": "MY_TEST_TOKEN"}).token == (
        "from-env"
    )
    for opts in (
        {"token_file": str(tmp_path / "missing")},
        {"token": "a", "token_env": "MY_TEST_TOKEN"},
        {"token": "a", "token_file": str(tok)},
    ):
        with pytest.raises(EnvConfigError):
            RemoteOptions.parse({"url": "ws://h/ws", **opts})
    with thread_server(token="s3cret") as u:
        reward = asyncio.run(_score(remote(u, make_task(5), token_file=str(tok)), "answer-5"))
    assert reward.score == 1.0


def test_literal_token_is_redacted_from_config_yaml_and_checkpoint_config() -> None:
    """Defect: a literal ``multi_turn.envs.<type>.token`` was written to config.yaml and to every
    checkpoint's trainer_state.json."""
    prefix = "actor_rollout_ref.rollout.multi_turn.envs.my_remote"
    cfg = load_config(
        TrainConfig,
        None,
        [f"{prefix}.type=remote", f"{prefix}.token=s3cret-value", f"{prefix}.token_env=X"],
    )
    text = to_yaml(cfg)
    assert "s3cret-value" not in text and "token: <redacted>" in text and "token_env: X" in text
    saved = json.dumps(as_dict(cfg))
    assert "s3cret-value" not in saved and "<redacted>" in saved
    envs = cfg.actor_rollout_ref.rollout.multi_turn.envs
    assert envs["my_remote"]["token"] == "s3cret-value"  # the run itself still has it
