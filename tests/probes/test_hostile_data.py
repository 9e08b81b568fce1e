"""Data files a careless user (or a scraper) produces: each hostile row is a bad row, skipped
with its index (``data.bad_rows=skip``) or refused in one line (``error``), never a crash deep
inside the tokenizer or the JSON parser. Repeated indices are warned about."""

from __future__ import annotations

import json
import logging

import pytest

from tests.conftest import rlla_row, write_jsonl
from toolgrpo.data.loader import DataError, load_tasks


def _row(**extra_info) -> str:
    row = rlla_row(1)
    row["extra_info"].update(extra_info)
    return json.dumps(row)


def _surrogate_prompt() -> str:
    return json.dumps(rlla_row(1, user="tool \ud800 call"))  # json escapes it as \\ud800


def _surrogate_answer() -> str:
    return json.dumps(rlla_row(1, ground_truth="<think> x </think>\ud83d"))


# One JSONL line each; every one is a bad row.
HOSTILE_ROWS = {
    "nested_200k_deep": "[" * 200_000,  # RecursionError, even with bad_rows=skip
    "lone_surrogate_in_prompt": _surrogate_prompt(),  # TypeError in filter_overlong
    "lone_surrogate_in_ground_truth": _surrogate_answer(),
    "nan_index": _row(index=float("nan")),  # accepted silently, task id "file#nan"
    "infinite_index": _row(index=float("inf")),
    "bool_index": _row(index=True),
    "list_index": _row(index=[1]),
    "empty_index": _row(index=" "),
}


@pytest.mark.parametrize("line", HOSTILE_ROWS.values(), ids=HOSTILE_ROWS.keys())
def test_hostile_row_is_a_bad_row(line, tmp_path, caplog):
    data = write_jsonl(tmp_path / "d.jsonl", [rlla_row(0), line, rlla_row(2)])
    with caplog.at_level(logging.WARNING):
        loaded = load_tasks([str(data)], bad_rows="skip")
    assert [t.meta["index"] for t in loaded.tasks] == [0, 2]
    assert [p.index for p in loaded.problems] == [1]
    assert "row 1" in caplog.text
    with pytest.raises(DataError, match=r"malformed row: .*d\.jsonl row 1: "):
        load_tasks([str(data)], bad_rows="error")


def test_whole_float_index_is_a_number(tmp_path):
    """pandas writes integer columns with a gap as floats: 3.0 is row index 3."""
    data = write_jsonl(tmp_path / "d.jsonl", [_row(index=3.0)])
    assert load_tasks([str(data)]).tasks[0].task_id.endswith("#3")


def test_repeated_indices_are_warned(tmp_path, caplog):
    data = write_jsonl(tmp_path / "d.jsonl", [rlla_row(4), rlla_row(5), rlla_row(4), rlla_row(4)])
    with caplog.at_level(logging.WARNING):
        loaded = load_tasks([str(data)])
    assert len(loaded.tasks) == 4  # kept: a repeat is suspicious, not wrong
    assert "2 row(s) repeat an earlier row's extra_info.index (e.g. " in caplog.text
    assert "rows 0 and 2" in caplog.text


def test_deeply_nested_json_file_is_one_line(tmp_path):
    path = tmp_path / "d.json"
    path.write_text("[" * 200_000)
    with pytest.raises(DataError, match="nested too deeply"):
        load_tasks([str(path)])


def test_infer_prompt_with_a_lone_surrogate_is_refused(capsys, no_model):
    """Non-UTF-8 bytes on the command line arrive as lone surrogates (surrogateescape)."""
    from toolgrpo.cli import main

    assert main(["infer", "what is \udcff 2+2?"]) == 2
    assert "the prompt holds a lone surrogate" in capsys.readouterr().err
