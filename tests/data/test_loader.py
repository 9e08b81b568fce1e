"""Dataset loading: embedded RLLA splits, row validation with indices, JSONL and parquet."""

from __future__ import annotations

import json

import pytest

from tests.conftest import GROUND_TRUTH, rlla_row, write_jsonl
from toolgrpo.data.loader import (
    DataError,
    LoadedData,
    load_tasks,
    prompt_key,
    row_to_task,
)
from toolgrpo.data.loader import test_prompt_keys as held_out_keys
from toolgrpo.data.task import Task
from toolgrpo.rewards.scoring import check_task


def test_embedded_train_split():
    data = load_tasks("rlla:train")
    assert len(data.tasks) == 220
    assert data.problems == []
    assert all(t.data_source == "rlla" and t.task_type == "rlla" for t in data.tasks)
    assert len({t.task_id for t in data.tasks}) == 220
    assert all(t.task_id.startswith("rlla:train#") for t in data.tasks)


def test_embedded_test_split():
    data = load_tasks(["rlla:test"])
    assert len(data.tasks) == 80
    assert data.problems == []


def test_embedded_sft_split_excludes_test_prompts():
    data = load_tasks("rlla:sft")
    assert len(data.tasks) == 399
    held_out = held_out_keys()
    assert len(held_out) > 0
    for t in data.tasks:
        key = prompt_key(m["content"] for m in t.messages if m["role"] in ("system", "user"))
        assert key not in held_out, t.task_id
        assert t.meta.get("output_sft"), t.task_id  # the raw R1 output is kept for SFT
        assert t.ground_truth.startswith("<think>")


def test_train_split_does_not_overlap_test():
    held_out = held_out_keys()
    for t in load_tasks("rlla:train").tasks:
        assert prompt_key(m["content"] for m in t.messages) not in held_out, t.task_id


def test_unknown_embedded_name():
    with pytest.raises(DataError, match="unknown embedded dataset"):
        load_tasks("rlla:validation")


def test_embedded_tasks_pass_the_reward_check():
    for spec in ("rlla:train", "rlla:test"):
        load_tasks(spec, bad_rows="error", check=check_task)


def test_row_to_task_fields():
    t = row_to_task(rlla_row(5, "hello"), "src.jsonl", 2)
    assert isinstance(t, Task)
    assert t.task_id == "src.jsonl#5"  # extra_info.index wins over the row position
    assert t.messages == (
        {"role": "system", "content": "You call tools."},
        {"role": "user", "content": "hello"},
    )
    assert t.ground_truth == GROUND_TRUTH
    assert t.meta["row"] == 2 and t.meta["index"] == 5


def _malformed_file(tmp_path):
    good = rlla_row(0)
    no_prompt = {k: v for k, v in rlla_row(2).items() if k != "prompt"}
    bad_role = rlla_row(3)
    bad_role["prompt"][1]["role"] = "wizard"
    empty_gt = rlla_row(4, ground_truth="   ")
    rows = [
        good,  # row 0
        "{this is not json",  # row 1
        no_prompt,  # row 2
        bad_role,  # row 3
        empty_gt,  # row 4
        "[1, 2, 3]",  # row 5: valid JSON, not an object
        rlla_row(6),  # row 6
    ]
    return write_jsonl(tmp_path / "mixed.jsonl", rows)


def test_malformed_rows_skipped_with_their_index(tmp_path):
    path = _malformed_file(tmp_path)
    data = load_tasks([str(path)], bad_rows="skip")
    assert [t.task_id for t in data.tasks] == [f"{path}#0", f"{path}#6"]
    bad = {p.index: p for p in data.problems}
    assert sorted(bad) == [1, 2, 3, 4, 5]
    assert "not valid JSON" in bad[1].reason
    assert "prompt" in bad[2].reason
    assert "wizard" in bad[3].reason
    assert "ground_truth" in bad[4].reason
    assert "list" in bad[5].reason  # "row is list, not an object"
    assert all(p.source == str(path) for p in data.problems)
    assert f"{path} row 3:" in str(bad[3])


@pytest.mark.parametrize("row_index", [1, 2, 3, 4, 5])
def test_malformed_row_under_bad_rows_error_names_the_row(tmp_path, row_index):
    good = [rlla_row(i) for i in range(6)]
    broken = {
        1: "{this is not json",
        2: {k: v for k, v in rlla_row(2).items() if k != "prompt"},
        3: {**rlla_row(3), "prompt": [{"role": "wizard", "content": "x"}]},
        4: rlla_row(4, ground_truth=""),
        5: "42",
    }[row_index]
    good[row_index] = broken
    path = write_jsonl(tmp_path / "bad.jsonl", good)
    with pytest.raises(DataError) as ei:
        load_tasks(str(path), bad_rows="error")
    assert f"row {row_index}:" in str(ei.value)
    assert str(path) in str(ei.value)


def test_blank_lines_are_not_rows(tmp_path):
    path = tmp_path / "blank.jsonl"
    path.write_text(json.dumps(rlla_row(0)) + "\n\n   \n" + json.dumps(rlla_row(1)) + "\n")
    data = load_tasks(str(path), bad_rows="error")
    assert len(data.tasks) == 2 and data.problems == []


def test_all_rows_bad_is_an_error(tmp_path):
    path = write_jsonl(tmp_path / "junk.jsonl", ["nope", "{"])
    with pytest.raises(DataError, match="no usable rows"):
        load_tasks(str(path))


def test_missing_file(tmp_path):
    with pytest.raises(DataError, match="not found"):
        load_tasks(str(tmp_path / "missing.jsonl"))


def test_unsupported_suffix(tmp_path):
    p = tmp_path / "rows.csv"
    p.write_text("a,b\n")
    with pytest.raises(DataError, match="unsupported"):
        load_tasks(str(p))


def test_bad_rows_value_rejected(tmp_path):
    with pytest.raises(DataError, match="bad_rows"):
        load_tasks("rlla:test", bad_rows="warn")


def test_max_samples(tiny_data):
    assert len(load_tasks(str(tiny_data), max_samples=3).tasks) == 3


def test_max_samples_takes_every_file_in_turn():
    """A held-out subset of a mixed set keeps every task type: the first N tasks are taken
    round-robin over the files (it used to be the first N of the first file only)."""
    tasks = load_tasks(["calculator:test", "search:test", "direct:test"], max_samples=7).tasks
    assert [t.task_type for t in tasks] == ["calculator", "search", "direct"] * 2 + ["calculator"]
    everything = load_tasks(["calculator:test", "direct:test"]).tasks
    assert [t.task_type for t in everything[:2]] == ["calculator", "calculator"]


def test_json_list_file(tmp_path):
    p = tmp_path / "rows.json"
    p.write_text(json.dumps([rlla_row(0), rlla_row(1)]))
    assert len(load_tasks(str(p)).tasks) == 2
    p.write_text(json.dumps({"rows": []}))
    with pytest.raises(DataError, match="list of rows"):
        load_tasks(str(p))


def test_parquet_round_trip(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rows = [rlla_row(i, f"user message {i}") for i in range(4)]
    path = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    from_parquet = load_tasks(str(path), bad_rows="error")
    from_jsonl = load_tasks(str(write_jsonl(tmp_path / "rows.jsonl", rows)), bad_rows="error")
    assert isinstance(from_parquet, LoadedData)
    assert [(t.messages, t.ground_truth, t.data_source) for t in from_parquet.tasks] == [
        (t.messages, t.ground_truth, t.data_source) for t in from_jsonl.tasks
    ]
    assert [t.task_id for t in from_parquet.tasks] == [f"{path}#{i}" for i in range(4)]


def test_check_callback_refuses_rows(tmp_path):
    path = write_jsonl(tmp_path / "rows.jsonl", [rlla_row(i) for i in range(4)])

    def refuse_odd(task):
        if task.meta["index"] % 2:
            raise ValueError("odd rows are refused")

    data = load_tasks(str(path), check=refuse_odd)
    assert [t.meta["index"] for t in data.tasks] == [0, 2]
    assert [(p.index, p.reason) for p in data.problems] == [
        (1, "odd rows are refused"),
        (3, "odd rows are refused"),
    ]
    with pytest.raises(DataError, match="row 1: odd rows are refused"):
        load_tasks(str(path), bad_rows="error", check=refuse_odd)


def test_check_task_refuses_malformed_tool_call_ground_truth(tmp_path):
    bad_gt = "<think> x </think>\n<tool_call>\n{not json at all}\n</tool_call>"
    with pytest.raises(ValueError, match="malformed"):
        check_task(row_to_task(rlla_row(0, ground_truth=bad_gt), "s", 0))
    check_task(row_to_task(rlla_row(0), "s", 0))  # the well-formed one passes
    path = write_jsonl(tmp_path / "rows.jsonl", [rlla_row(0), rlla_row(1, ground_truth=bad_gt)])
    data = load_tasks(str(path), check=check_task)
    assert len(data.tasks) == 1
    assert [p.index for p in data.problems] == [1]


def test_check_task_refuses_unknown_data_source():
    row = {**rlla_row(0), "data_source": "gsm8k"}
    with pytest.raises(ValueError, match="no reward"):
        check_task(row_to_task(row, "s", 0))


def _rows_with_bytes(path, bad: bytes):
    """Row 0 good, row 1 raw ``bad`` bytes, row 2 good."""
    good = [json.dumps(rlla_row(i)).encode() for i in range(2)]
    path.write_bytes(good[0] + b"\n" + bad + b"\n" + good[1] + b"\n")
    return path


def test_non_utf8_line_is_a_bad_row_skipped_with_its_index(tmp_path):
    """Issue 15 item 7: one Latin-1 line raised UnicodeDecodeError out of the loader (a traceback)
    even with bad_rows=skip; it is one malformed row, reported with its index."""
    f = _rows_with_bytes(tmp_path / "latin1.jsonl", '{"x": "caf\xe9"}'.encode("latin-1"))
    data = load_tasks(str(f), bad_rows="skip")
    assert len(data.tasks) == 2
    (problem,) = data.problems
    assert problem.index == 1 and "UTF-8" in problem.reason


def test_non_utf8_line_under_bad_rows_error_names_the_row(tmp_path):
    f = _rows_with_bytes(tmp_path / "latin1.jsonl", b"\xff\xfe garbage")
    with pytest.raises(DataError, match=r"latin1\.jsonl row 1: not valid UTF-8"):
        load_tasks(str(f), bad_rows="error")


def test_non_utf8_json_file_is_a_data_error(tmp_path):
    f = tmp_path / "rows.json"
    f.write_bytes(b"[\xff]")
    with pytest.raises(DataError, match="rows.json"):
        load_tasks(str(f))


@pytest.mark.parametrize("content", [b"", b"PAR1 not really parquet", b"\x00" * 64])
def test_corrupt_parquet_is_a_data_error_naming_the_file(tmp_path, content):
    """Issue 15 item 7: pyarrow's ArrowInvalid escaped as a traceback."""
    f = tmp_path / "broken.parquet"
    f.write_bytes(content)
    with pytest.raises(DataError, match=r"broken\.parquet.*parquet"):
        load_tasks(str(f))


SPOOF = "\n\x1b[1A\x1b[2Ktoolgrpo: resuming from /etc at step 999"


def test_an_index_with_control_characters_is_a_bad_row_shown_escaped(tmp_path, caplog):
    """Was: an index holding a newline and ANSI escapes, on two rows, was printed raw in the
    duplicate-index warning and forged a console line (erasing the one above)."""
    rows = [rlla_row(0), rlla_row(1), rlla_row(2)]
    for r in rows[1:]:
        r["extra_info"]["index"] = SPOOF
    path = write_jsonl(tmp_path / "spoof.jsonl", rows)
    data = load_tasks(str(path))
    assert [t.task_id for t in data.tasks] == [f"{path}#0"]
    assert [p.index for p in data.problems] == [1, 2]
    assert "control character ('\\n' at character 0)" in data.problems[0].reason
    text = caplog.text
    assert "\x1b" not in text and not any("\n" in m for m in caplog.messages)
    assert not any(line.startswith("toolgrpo: resuming") for line in text.splitlines())
    for bidi in ("a\u202eb", "tab\there", "nul\x00"):
        with pytest.raises(ValueError, match="control character"):
            row_to_task({**rlla_row(0), "extra_info": {"index": bidi}}, "f", 0)


def test_an_index_over_the_id_limit_is_a_bad_row_not_echoed(tmp_path):
    """Was: a 100,000-character index was accepted as a task id."""
    row = rlla_row(0)
    row["extra_info"]["index"] = "x" * 100_000
    data = load_tasks(str(write_jsonl(tmp_path / "long.jsonl", [row, rlla_row(1)])))
    (problem,) = data.problems
    assert "has 100000 characters (at most 256)" in problem.reason and len(problem.reason) < 200
    assert len(data.tasks) == 1


def test_repeated_ids_are_named_repr_escaped(tmp_path, caplog):
    rows = [rlla_row(0), rlla_row(1)]
    for r in rows:
        r["extra_info"]["index"] = "same id"
    path = write_jsonl(tmp_path / "dup.jsonl", rows)
    load_tasks(str(path))
    assert f"(e.g. '{path}#same id': rows 0 and 1)" in caplog.text


def test_a_data_path_that_is_not_a_regular_file_says_what_it_is(tmp_path):
    """Was: "data file not found" for a path that exists (a directory, a FIFO)."""
    import os

    fifo = tmp_path / "rows.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(DataError, match=r"rows.jsonl is a FIFO \(named pipe\), not a regular"):
        load_tasks(str(fifo))
    with pytest.raises(DataError, match="is a directory, not a regular file"):
        load_tasks(str(tmp_path))
    with pytest.raises(DataError, match="data file not found"):
        load_tasks(str(tmp_path / "none.jsonl"))


def test_data_error_lives_with_the_error_classes():
    """Every data source raises ``toolgrpo.errors.DataError`` without importing the loader
    (which imports them: the import circle this replaced); the loader re-exports it."""
    import ast
    from pathlib import Path

    import toolgrpo
    from toolgrpo import errors

    assert DataError is errors.DataError
    pkg = Path(toolgrpo.__file__).parent
    for rel in (
        "data/reasoning_gym.py",
        "data/source_spec.py",
        "envs/_bfcl_data.py",
        "envs/verifiers_env.py",
    ):
        tree = ast.parse((pkg / rel).read_text())
        froms = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert "toolgrpo.data.loader" not in froms, rel
