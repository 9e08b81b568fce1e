"""Procedural tasks from reasoning-gym (extra ``toolgrpo[reasoning-gym]``): a data source
``reasoning_gym:<dataset>[:train|test][?size=N&seed=S&<config key>=value...]``.

Every item is generated from the dataset's seed and its index, so a task stores only where it
came from (``Task.meta["reasoning_gym"]``) and the ``reasoning_gym`` environment regenerates the
entry to score an answer with the dataset's own ``score_answer``. ``train`` and ``test`` draw from
disjoint seeds (2·seed and 2·seed + 1), so the same ``seed`` never yields the same items in both.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from toolgrpo.data.source_spec import parse_source_spec
from toolgrpo.data.task import Task
from toolgrpo.errors import DataError

KIND = "reasoning_gym"
SPLITS = ("train", "test")
DEFAULT_SIZE = {"train": 1000, "test": 100}
MAX_SIZE = 1_000_000


@dataclass(frozen=True)
class RGSource:
    """Where a task's entry comes from; ``config`` is the dataset's own options as JSON text."""

    dataset: str
    seed: int  # the split's seed, what reasoning-gym is given
    size: int
    config: str = "{}"

    def to_meta(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset,
            "seed": self.seed,
            "size": self.size,
            "config": self.config,
        }

    @classmethod
    def from_meta(cls, meta: Any) -> RGSource:
        if not isinstance(meta, dict):
            raise ValueError("the task was not loaded from a reasoning_gym: data source")
        return cls(str(meta["dataset"]), int(meta["seed"]), int(meta["size"]), str(meta["config"]))


def _rg() -> Any:
    try:
        import reasoning_gym
    except ImportError as e:
        raise DataError(
            "reasoning_gym: data sources need the reasoning-gym package "
            "(pip install 'toolgrpo[reasoning-gym]')"
        ) from e
    return reasoning_gym


def dataset_names() -> list[str]:
    _rg()  # importing the package registers its datasets
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


@lru_cache(maxsize=32)
def rg_dataset(source: RGSource) -> Any:
    """The reasoning-gym dataset object (cheap: items are generated on access)."""
    rg = _rg()
    names = dataset_names()
    if source.dataset not in names:
        close = difflib.get_close_matches(source.dataset, names, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else f" (known: {', '.join(names)})"
        raise DataError(f"unknown reasoning-gym dataset {source.dataset!r}{hint}")
    config = json.loads(source.config)
    try:
        return rg.create_dataset(source.dataset, seed=source.seed, size=source.size, **config)
    except (TypeError, ValueError, AssertionError) as e:
        raise DataError(
            f"reasoning-gym dataset {source.dataset!r} refused its options {config}: "
            f"{type(e).__name__}: {e}"
        ) from e


def rg_entry(source: RGSource, index: int) -> dict[str, Any]:
    """Item ``index`` (question, answer, metadata), the same in every process."""
    return rg_dataset(source)[index]


def parse_spec(spec: str) -> tuple[RGSource, str]:
    """The source a spec names and its split."""
    s = parse_source_spec(spec, KIND, SPLITS)
    config = dict(s.args)
    size, seed = config.pop("size", DEFAULT_SIZE[s.split]), config.pop("seed", 0)
    for key, value in (("size", size), ("seed", seed)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise DataError(f"{spec!r}: {key} must be a whole number >= 0, got {value!r}")
    if not 1 <= size <= MAX_SIZE:
        raise DataError(f"{spec!r}: size must be between 1 and {MAX_SIZE}, got {size}")
    split_seed = 2 * seed + SPLITS.index(s.split)
    return RGSource(s.name, split_seed, size, json.dumps(config, sort_keys=True)), s.split


def reasoning_gym_tasks(spec: str) -> list[Task | Exception]:
    """The spec's items as tasks of type ``reasoning_gym``; an item without a question or a text
    answer is a bad row (its error), reported by the loader like a malformed file row."""
    source, split = parse_spec(spec)
    dataset = rg_dataset(source)
    label = f"{KIND}:{source.dataset}:{split}"
    out: list[Task | Exception] = []
    for i in range(source.size):
        try:
            entry = dataset[i]
        except Exception as e:  # a generator bug on one item: that row, not the run
            out.append(ValueError(f"reasoning-gym could not generate item {i}: {e!r}"))
            continue
        question, answer = entry.get("question"), entry.get("answer")
        if not isinstance(question, str) or not question.strip():
            out.append(ValueError(f"item {i} has no question"))
        elif not isinstance(answer, str) or not answer.strip():
            out.append(ValueError(f"item {i} has no text answer ({answer!r})"))
        else:
            out.append(
                Task(
                    task_id=f"{label}#{i}",
                    messages=({"role": "user", "content": question},),
                    ground_truth=answer,
                    data_source=f"{KIND}:{source.dataset}",
                    task_type=KIND,
                    meta={"index": i, "split": split, "row": i, KIND: source.to_meta()},
                )
            )
    return out
