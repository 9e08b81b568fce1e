"""``toolgrpo label``: weak router labels for a dataset from an OpenAI-compatible endpoint,
written to a sidecar JSON (``router.label_file``; its ``tools`` also serve as
``router.families_file``). No dataset column changes."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter

from toolgrpo.data.loader import load_tasks
from toolgrpo.envs.registry import EnvRouter
from toolgrpo.router.catalog import env_tools
from toolgrpo.router.labeler import ChatClient, LabelerError, label_tasks
from toolgrpo.safe_io import refuse_link, write_text


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("label", help="weak router labels from an OpenAI-compatible endpoint")
    p.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8000/v1")
    p.add_argument("--model", required=True)
    p.add_argument("--data", action="append", required=True, help="rlla:train, a .jsonl, ...")
    p.add_argument("--out", required=True, help="the labels JSON to write")
    p.add_argument("--api-key-env", default="OPENAI_API_KEY", help="env var holding the key")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds per request")
    p.add_argument("--tools-per-request", type=int, default=20)
    p.add_argument("--max-examples", type=int, default=-1, help="cap on per-example requests")
    p.add_argument("--limit", type=int, default=-1, help="label only the first N tasks")
    p.set_defaults(func=run_label)


def run_label(args: argparse.Namespace) -> int:
    refuse_link(args.out)  # before any request is paid for
    tasks = load_tasks(args.data, "skip", args.limit).tasks
    key = os.environ.get(args.api_key_env) or None
    client = ChatClient(args.base_url, args.model, key, args.timeout)
    try:
        labels = label_tasks(
            tasks,
            client,
            tools_per_request=args.tools_per_request,
            max_example_queries=args.max_examples,
            progress=lambda msg: print(msg, file=sys.stderr),
            extra_tools=env_tools(tasks, EnvRouter()),
        )
    except LabelerError as e:
        print(f"toolgrpo label: error: {e}", file=sys.stderr)
        return 2
    out = write_text(args.out, json.dumps(labels.to_json(args.model), indent=1, ensure_ascii=False))
    counts = Counter(labels.examples.values())
    print(json.dumps({"out": str(out), "tasks": len(tasks), "labels": counts, **labels.stats}))
    return 0
