"""The labeler against a real OpenAI-style HTTP server on loopback (FastAPI + uvicorn): good
replies, garbage, HTTP errors, and an endpoint that is down."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from toolgrpo.cli import main
from toolgrpo.config.router import RouterConfig
from toolgrpo.data.loader import load_tasks
from toolgrpo.envs.registry import EnvRouter
from toolgrpo.router.catalog import env_tools, load_labels
from toolgrpo.router.families import FamilyMap, message_tools
from toolgrpo.router.labeler import (
    ChatClient,
    LabelerError,
    label_from_ground_truth,
    label_tasks,
    parse_families_reply,
    parse_label_reply,
)


def _reply(content: str) -> dict:
    return {"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]}


def make_app() -> FastAPI:
    app = FastAPI()
    app.state.requests = []

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        app.state.requests.append(body)
        mode, system = body["model"], body["messages"][0]["content"]
        user = body["messages"][-1]["content"]
        if mode == "error":
            return JSONResponse({"error": "boom"}, status_code=500)
        if mode == "html":
            return PlainTextResponse("<html>not an API</html>")
        if mode == "garbage":
            return _reply("lorem ipsum dolor sit amet")
        if system.startswith("You sort the tools"):
            names = [t["name"] for t in json.loads(user)]
            fams = {n: "CALCULATE" if n in ("calculate", "solve") else "SEARCH" for n in names}
            return _reply("Here you go:\n```json\n" + json.dumps(fams) + "\n```")
        return _reply("CALCULATE" if "Task type: calculator" in user else "Label: SEARCH")

    return app


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    app = make_app()
    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.time() + 20
    while not srv.started and time.time() < deadline:
        time.sleep(0.05)
    assert srv.started, "the test server did not start"
    yield f"http://127.0.0.1:{port}/v1", app
    srv.should_exit = True
    thread.join(timeout=10)


@pytest.fixture(scope="module")
def tasks():
    return (
        load_tasks(["rlla:train"], max_samples=12).tasks
        + load_tasks(["calculator:train"], max_samples=2).tasks
    )


def test_reply_parsing_is_lenient():
    assert parse_families_reply('ok {"a": "search", "b": "maybe"}', ["a", "b", "c"]) == {
        "a": "SEARCH"
    }
    assert parse_families_reply("no json here", ["a"]) == {}
    assert parse_label_reply('{"label": "calculate"}') == "CALCULATE"
    assert parse_label_reply("I think MIXED.") == "MIXED"
    assert parse_label_reply("¯\\_(ツ)_/¯") is None


def test_labels_from_a_working_endpoint(server, tasks):
    url, app = server
    labels = label_tasks(tasks, ChatClient(url, "good"), extra_tools=env_tools(tasks, EnvRouter()))
    assert labels.tools["calculate"] == labels.tools["solve"] == "CALCULATE"
    rlla_tool = message_tools(tasks[0].messages)[0].name
    assert labels.tools[rlla_tool] == "SEARCH"
    fm = FamilyMap(overrides=dict(labels.tools))
    for t in tasks:
        if t.task_type == "rlla":  # the ground truth decides, with the endpoint's families
            assert labels.examples[t.task_id] == label_from_ground_truth(t, fm)
        else:  # a bare answer: the endpoint was asked
            assert labels.examples[t.task_id] == "CALCULATE"
    assert {"ANSWER", "SEARCH"} <= set(labels.examples.values())
    assert labels.stats["failed"] == 0 and labels.stats["examples_asked"] == 2
    assert app.state.requests[0]["temperature"] == 0.0


@pytest.mark.parametrize(
    "model, message",
    [
        ("garbage", "no reply could be parsed"),
        ("error", "HTTP 500"),
        ("html", "non-OpenAI reply"),
    ],
)
def test_a_broken_endpoint_is_a_clear_error(server, tasks, model, message):
    with pytest.raises(LabelerError, match=message):
        label_tasks(tasks, ChatClient(server[0], model))


def test_an_endpoint_that_is_down(tasks):
    url = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(LabelerError, match="unreachable"):
        label_tasks(tasks, ChatClient(url, "good", timeout_s=2.0))


def test_label_cli_writes_the_sidecar(server, tmp_path, capsys):
    out = tmp_path / "labels.json"
    argv = ["label", "--base-url", server[0], "--model", "good", "--data", "calculator:train"]
    assert main([*argv, "--limit", "3", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["tools"] == {"calculate": "CALCULATE", "solve": "CALCULATE"}
    assert set(data["examples"].values()) == {"CALCULATE"} and len(data["examples"]) == 3
    down = ["label", "--base-url", f"http://127.0.0.1:{free_port()}/v1", "--model", "m"]
    code = main([*down, "--data", "rlla:train", "--limit", "2", "--out", str(tmp_path / "x")])
    assert code == 2 and "unreachable" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_training_goes_on_without_labels_when_the_labeler_fails(server, tasks, tmp_path, caplog):
    rc = RouterConfig(label_file=str(tmp_path / "labels.json"))
    rc.labeler.base_url, rc.labeler.model = server[0], "garbage"
    with caplog.at_level(logging.ERROR):
        assert load_labels(rc, tasks) is None
    assert "training continues without labels" in caplog.text
    assert not (tmp_path / "labels.json").exists()
    rc.labeler.model = "good"  # a working endpoint: labels, written for the next run
    assert load_labels(rc, tasks[:3]) is not None and (tmp_path / "labels.json").is_file()
