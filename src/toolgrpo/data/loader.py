"""Loading verl/RLLA-schema rows (JSONL or parquet) into validated ``Task`` objects.

Rows are checked when the file is read, so a malformed row is reported with its index and skipped
(or the file refused) before training starts, never halfway through a run.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import unicodedata
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from toolgrpo.data.task import ROLES, RowProblem, Task
from toolgrpo.errors import DataError, shown
from toolgrpo.safe_io import path_kind

log = logging.getLogger(__name__)

RowCheck = Callable[[Task], None]  # raises ValueError to refuse a row

RLLA_TOOL_THOUGHT = (
    "<think> I should use the appropriate tool with proper parameters to respond to the user's "
    "need. </think>"
)
RLLA_RESPONSE_THOUGHT = "<think> I should directly respond to the user's need. </think>"


@dataclass(frozen=True)
class LoadedData:
    tasks: list[Task]
    problems: list[RowProblem]


def embedded_path(name: str, folder: str = "rlla") -> Path:
    """Path of a file shipped in ``toolgrpo/data/<folder>``."""
    return Path(str(resources.files("toolgrpo.data").joinpath(folder, name)))


def read_rows(path: str | Path) -> Iterator[dict[str, Any] | Exception]:
    """Yield raw rows of a JSONL or parquet file; a JSONL line that is not UTF-8 or not JSON
    yields its error (a bad row, reported with its index), an unreadable file raises DataError."""
    p = Path(path)
    if not p.exists():
        raise DataError(f"data file not found: {p}")
    if not p.is_file():
        raise DataError(f"data file {p} is {path_kind(p)}, not a regular file")
    if p.suffix == ".parquet":
        yield from _parquet_rows(p)
        return
    if p.suffix not in (".jsonl", ".json"):
        raise DataError(f"unsupported data file type {p.suffix!r} (want .jsonl or .parquet): {p}")
    if p.suffix == ".json":
        try:
            rows = json.loads(p.read_bytes().decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise DataError(f"{p}: not a UTF-8 JSON file ({e})") from e
        except RecursionError:
            raise DataError(f"{p}: {_TOO_DEEP}") from None
        if not isinstance(rows, list):
            raise DataError(f"{p}: a .json dataset must hold a list of rows")
        yield from rows
        return
    with p.open("rb") as fh:  # bytes: one undecodable line is one bad row, not a dead file
        for raw in fh:
            if not raw.strip():
                continue
            try:
                yield json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError as e:
                yield ValueError(f"not valid UTF-8 ({e.reason} at byte {e.start})")
            except json.JSONDecodeError as e:
                yield ValueError(f"not valid JSON ({e})")
            except RecursionError:  # "[[[[..." deeper than Python's parser recurses
                yield ValueError(_TOO_DEEP)


_TOO_DEEP = "nested too deeply to parse (arrays or objects inside each other)"


def _parquet_rows(p: Path) -> list[dict[str, Any]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.read_table(p).to_pylist()
    except (pa.ArrowException, OSError) as e:
        raise DataError(f"{p}: not a readable parquet file ({e})") from e


def row_to_task(row: Any, source: str, index: int) -> Task:
    """Validate one verl-schema row and turn it into a ``Task``; ValueError says why not."""
    if not isinstance(row, dict):
        raise ValueError(f"row is {type(row).__name__}, not an object")
    prompt = row.get("prompt")
    if not isinstance(prompt, list) or not prompt:
        raise ValueError("'prompt' must be a non-empty list of messages")
    messages = []
    for m in prompt:
        if not isinstance(m, dict) or not isinstance(m.get("content"), str):
            raise ValueError("each prompt message needs a string 'content'")
        if m.get("role") not in ROLES:
            raise ValueError(f"message role {m.get('role')!r} is not one of {ROLES}")
        check_text(m["content"], "a prompt message")
        messages.append({"role": m["role"], "content": m["content"]})
    rm = row.get("reward_model")
    gt = rm.get("ground_truth") if isinstance(rm, dict) else None
    if not isinstance(gt, str) or not gt.strip():
        raise ValueError("'reward_model.ground_truth' must be a non-empty string")
    check_text(gt, "'reward_model.ground_truth'")
    data_source = row.get("data_source")
    if not isinstance(data_source, str) or not data_source:
        raise ValueError("'data_source' must be a non-empty string")
    extra = row.get("extra_info") if isinstance(row.get("extra_info"), dict) else {}
    task_type = row.get("task_type") or extra.get("task_type") or _task_type(data_source)
    idx = _row_index(extra.get("index", index))
    return Task(
        task_id=f"{source}#{idx}",
        messages=tuple(messages),
        ground_truth=gt,
        data_source=data_source,
        task_type=str(task_type),
        meta={
            "index": idx,
            "split": extra.get("split"),
            "row": index,
            **({"output_sft": extra["output_sft"]} if "output_sft" in extra else {}),
            # arith_mixed's label: whether the task needs a tool (what a router is scored against)
            **({"needs_tool": extra["needs_tool"]} if "needs_tool" in extra else {}),
        },
    )


def check_text(text: str, what: str) -> None:
    """Refuse text no tokenizer can encode: a lone surrogate (``"\\ud800"`` in JSON) is valid
    JSON but not Unicode text, and fails deep inside the tokenizer with a TypeError."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(
            f"{what} holds a lone surrogate ({text[e.start]!r} at character {e.start}), which is "
            "not valid Unicode text"
        ) from None


def _row_index(idx: Any) -> int | str:
    """``extra_info.index``: a whole number (a float that is one, as pandas writes them) or a
    non-empty string; NaN, infinities and other values name no row."""
    if isinstance(idx, bool):
        raise ValueError(f"'extra_info.index' is {idx!r}, not a whole number or a string")
    if isinstance(idx, float) and math.isfinite(idx) and idx.is_integer():
        return int(idx)
    if isinstance(idx, int) or (isinstance(idx, str) and idx.strip()):
        if isinstance(idx, str):
            check_text(idx, "'extra_info.index'")
        check_id(str(idx), "'extra_info.index'")
        return idx
    raise ValueError(f"'extra_info.index' is {shown(idx)}, not a whole number or a string")


MAX_ID_CHARS = 256  # a task id is a key in dumps, reports and labels, and printed in warnings


def check_id(text: str, what: str = "the task id", limit: int = MAX_ID_CHARS) -> None:
    """Refuse an id a console would not show as written: a control or format character (a
    newline, an ANSI escape, a bidi override could forge or erase a line of the console), or
    one over ``limit`` characters."""
    if len(text) > limit:
        raise ValueError(f"{what} has {len(text)} characters (at most {limit})")
    bad = next((c for c in text if unicodedata.category(c) in ("Cc", "Cf")), None)
    if bad is not None:
        raise ValueError(
            f"{what} {shown(text)} holds a control character ({bad!r} at character "
            f"{text.index(bad)})"
        )


def _task_type(data_source: str) -> str:
    return "rlla" if "rlla" in data_source else data_source


def sft_row_to_rl_row(row: dict[str, Any], index: int) -> dict[str, Any]:
    """Turn an RLLA SFT row {instruction, input, output} into the RL schema (ToolRL's convention).

    The R1 thought is replaced by ToolRL's placeholder thought; the raw output is kept in
    ``extra_info.output_sft`` for SFT on full thoughts.
    """
    out = row["output"]
    head, sep, tail = out.rpartition("</think>")
    if not sep:
        raise ValueError("SFT output has no </think>")
    thought = RLLA_TOOL_THOUGHT if "<tool_call>" in tail else RLLA_RESPONSE_THOUGHT
    return {
        "data_source": "rlla",
        "prompt": [
            {"role": "system", "content": row["instruction"]},
            {"role": "user", "content": row["input"]},
        ],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": thought + tail},
        "extra_info": {"split": "sft", "index": index, "output_sft": out},
    }


def _embedded_rows(name: str) -> Iterator[dict[str, Any] | Exception]:
    if name == "test":
        yield from read_rows(embedded_path("rlla_4k_test.jsonl"))
    elif name == "train":
        for row in read_rows(embedded_path("rlla_sample300.jsonl")):
            if isinstance(row, dict) and row.get("extra_info", {}).get("split") == "sft_derived":
                yield row
    elif name == "sft":
        held_out = test_prompt_keys()
        for i, row in enumerate(read_rows(embedded_path("rlla_sft.jsonl"))):
            if isinstance(row, Exception):
                yield row
            elif prompt_key([row["instruction"], row["input"]]) not in held_out:
                yield sft_row_to_rl_row(row, i)
    else:
        raise DataError(
            f"unknown embedded dataset 'rlla:{name}' (have rlla:train, rlla:test, rlla:sft)"
        )


# Generated environment tasks shipped in toolgrpo/data/envs (scripts/make_env_data.py).
ENV_DATASETS = ("calculator", "search", "direct", "arith_mixed")


def _embedded_env_rows(env: str, name: str) -> Iterator[dict[str, Any] | Exception]:
    if name not in ("train", "test"):
        raise DataError(f"unknown embedded dataset '{env}:{name}' (have {env}:train, {env}:test)")
    return read_rows(embedded_path(f"{env}_{name}.jsonl", "envs"))


def prompt_key(contents: Iterable[str]) -> str:
    """A content key for a prompt, used to keep the held-out test split out of training data."""
    return "\x1e".join(c.strip() for c in contents)


_TEST_KEYS: set[str] | None = None


def test_prompt_keys() -> set[str]:
    """Prompt keys of the embedded RLLA test split."""
    global _TEST_KEYS
    if _TEST_KEYS is None:
        _TEST_KEYS = {
            prompt_key(m["content"] for m in r["prompt"])
            for r in read_rows(embedded_path("rlla_4k_test.jsonl"))
            if isinstance(r, dict)
        }
    return _TEST_KEYS


def _warn_duplicates(source: str, tasks: list[Task]) -> None:
    """Rows of one file sharing an ``extra_info.index`` share a task id (what the dumps,
    reports and the router's labels key on): said once per file, with the first repeat."""
    seen: dict[str, int] = {}
    repeats: list[tuple[str, int, int]] = []
    for t in tasks:
        row = int(t.meta.get("row", -1))
        if t.task_id in seen:
            repeats.append((t.task_id, seen[t.task_id], row))
        else:
            seen[t.task_id] = row
    if repeats:
        tid, first, again = repeats[0]
        log.warning(
            "%s: %d row(s) repeat an earlier row's extra_info.index (e.g. %r: rows %d and %d); "
            "their task ids collide in dumps and reports",
            source,
            len(repeats),
            tid,
            first,
            again,
        )


def load_tasks(
    specs: str | list[str],
    bad_rows: str = "skip",
    max_samples: int = -1,
    check: RowCheck | None = None,
) -> LoadedData:
    """Load tasks from files or embedded names (``rlla:train``, ``calculator:test``), validating
    every row. ``max_samples`` keeps the first N tasks taken round-robin over the files, so a
    subset of a mixed validation set still holds every task type."""
    if bad_rows not in ("skip", "error"):
        raise DataError(f"data.bad_rows must be 'skip' or 'error', got {bad_rows!r}")
    per_file: list[list[Task]] = []
    problems: list[RowProblem] = []
    for spec in [specs] if isinstance(specs, str) else specs:
        tasks: list[Task] = []
        per_file.append(tasks)
        if spec.startswith("rlla:"):
            rows, source = _embedded_rows(spec.split(":", 1)[1]), spec
        elif spec.startswith("bfcl_multi_turn:"):
            # BFCL multi-turn only, read from the installed bfcl-eval package (imported lazily).
            from toolgrpo.envs._bfcl_data import bfcl_tasks

            rows, source = iter(bfcl_tasks(spec)), spec
        elif spec.startswith("schemas:"):  # generated function schemas (data/schema_tasks)
            from toolgrpo.data.schema_tasks import schema_tasks

            rows, source = iter(schema_tasks(spec)), spec.partition("?")[0]
        elif spec.startswith("reasoning_gym:"):  # generated by the reasoning-gym package
            from toolgrpo.data.reasoning_gym import reasoning_gym_tasks

            rows, source = iter(reasoning_gym_tasks(spec)), spec
        elif spec.startswith("verifiers:"):  # an installed verifiers environment's dataset
            from toolgrpo.envs.verifiers_env import verifiers_tasks

            rows, source = iter(verifiers_tasks(spec)), spec
        elif spec.partition(":")[0] in ENV_DATASETS:
            rows, source = _embedded_env_rows(*spec.split(":", 1)), spec
        else:
            rows, source = read_rows(spec), str(spec)
        for i, row in enumerate(rows):
            try:
                if isinstance(row, Exception):
                    raise row
                if isinstance(row, Task):  # a generated source's: its id is checked here
                    check_id(row.task_id, limit=MAX_ID_CHARS + len(source) + 1)
                task = row if isinstance(row, Task) else row_to_task(row, source, i)
                if check is not None:
                    check(task)
            except ValueError as e:
                problem = RowProblem(source, i, str(e))
                if bad_rows == "error":
                    raise DataError(f"malformed row: {problem}") from e
                log.warning("skipping malformed row: %s", problem)
                problems.append(problem)
                continue
            tasks.append(task)
        _warn_duplicates(source, tasks)
    if max_samples > 0:
        rounds = itertools.zip_longest(*per_file)
        tasks = [t for t in itertools.chain.from_iterable(rounds) if t is not None][:max_samples]
    else:
        tasks = [t for file_tasks in per_file for t in file_tasks]
    if not tasks:
        raise DataError(f"no usable rows in {specs} ({len(problems)} malformed)")
    return LoadedData(tasks, problems)
