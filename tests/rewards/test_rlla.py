"""Tests for the RLLA reward: hand-derived vectors, flags, errors and properties."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolgrpo.rewards.rlla import (
    RewardParts,
    RllaFlags,
    compute_score,
    extract_answer,
    parse_tool_calls,
)

HERE = Path(__file__).parent
VECTORS = json.loads((HERE / "rlla_vectors.json").read_text())
RLLA_DIR = Path("/work/shared/data/rlla")
FLAG_VARS = [
    "WITHLENGTH",
    "SCHEDULELENGTH",
    "CORRECTMAX1",
    "MAX1STEP30MAX3",
    "SCHEDULEREWARD",
    "REFINEDREWARD",
    "INTERMEDIATEREWARD",
    "COARSEREWARD",
]
TOL = 1e-9
THINK = "<think> I should use the appropriate tool. </think>"
W3 = {"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius", "days": 3}}
PARTIAL = {"name": "get_weather", "parameters": {"city": "Paris", "unit": "kelvin", "days": 3}}


def tool_answer(*calls: dict | str, think: str = THINK) -> str:
    lines = [c if isinstance(c, str) else json.dumps(c) for c in calls]
    return think + "\n<tool_call>\n" + "\n".join(lines) + "\n</tool_call>"


GT_W3 = tool_answer(W3)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in [*FLAG_VARS, "STRICTMATCH", "EXPERIMENT_NAME"]:
        monkeypatch.delenv(var, raising=False)


def assert_parts(got: RewardParts, expected: list[float]) -> None:
    assert len(got) == 4
    for part, value in zip(got, expected, strict=True):
        assert math.isclose(part, value, rel_tol=0.0, abs_tol=TOL), (tuple(got), expected)


# ---------------------------------------------------------------- vectors


def test_vector_file_is_big_and_unique() -> None:
    names = [v["name"] for v in VECTORS]
    assert len(VECTORS) >= 150
    assert len(names) == len(set(names))


@pytest.mark.parametrize("vec", VECTORS, ids=[v["name"] for v in VECTORS])
def test_vector_env(vec: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    for var, value in vec["env"].items():
        monkeypatch.setenv(var, value)
    got = compute_score(vec["solution_str"], vec["ground_truth"], vec["step"])
    assert_parts(got, vec["expected"])
    assert got.total == got.format + got.correctness + got.length


@pytest.mark.parametrize("vec", VECTORS, ids=[v["name"] for v in VECTORS])
def test_vector_config(vec: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    # Config wins over env: set every env var to the opposite of what the vector wants.
    wanted = {var.lower(): vec["env"].get(var) == "1" for var in FLAG_VARS}
    for var in FLAG_VARS:
        monkeypatch.setenv(var, "0" if wanted[var.lower()] else "1")
    got = compute_score(vec["solution_str"], vec["ground_truth"], vec["step"], RllaFlags(**wanted))
    assert_parts(got, vec["expected"])


# ---------------------------------------------------------------- flags

# (flags on, solution, gt, step, expected with the flag on, expected with it off)
FLAG_CASES = {
    "withlength": (tool_answer(W3, think="<think> a b c </think>"), GT_W3, 0, 4.01, 4.0),
    "correctmax1": (tool_answer(PARTIAL), GT_W3, 0, 1.6, 2.8),
    "max1step30max3": (tool_answer(W3), GT_W3, 30, 3.5, 4.0),
    "schedulereward": (tool_answer(W3), GT_W3, 0, 4.0, 4.0),
    "refinedreward": (tool_answer(W3, W3), GT_W3, 0, 2.8, 3.4),
    "intermediatereward": (tool_answer(PARTIAL), GT_W3, 0, 1.0, 2.8),
    "coarsereward": (tool_answer(PARTIAL), GT_W3, 0, -2.0, 2.8),
}


@pytest.mark.parametrize("flag", sorted(FLAG_CASES))
def test_flag_env_and_config_override(flag: str, monkeypatch: pytest.MonkeyPatch) -> None:
    sol, gt, step, on, off = FLAG_CASES[flag]
    if flag == "schedulereward":  # distinguishable through the parts, not the total
        sol = "<think> x </think>\n<response> y </response>"
        on, off = -4.0, -3.0
    assert compute_score(sol, gt, step).total == pytest.approx(off, abs=TOL)
    assert compute_score(sol, gt, step, RllaFlags(**{flag: True})).total == pytest.approx(
        on, abs=TOL
    )
    monkeypatch.setenv(flag.upper(), "1")
    assert compute_score(sol, gt, step).total == pytest.approx(on, abs=TOL)
    assert compute_score(sol, gt, step, RllaFlags()).total == pytest.approx(on, abs=TOL)
    got = compute_score(sol, gt, step, RllaFlags(**{flag: False}))
    assert got.total == pytest.approx(off, abs=TOL)


def test_schedulelength_needs_withlength(monkeypatch: pytest.MonkeyPatch) -> None:
    sol = tool_answer(W3, think="<think> " + "w " * 192 + "</think>")
    monkeypatch.setenv("SCHEDULELENGTH", "1")
    assert compute_score(sol, GT_W3).length == 0
    monkeypatch.setenv("WITHLENGTH", "1")
    assert compute_score(sol, GT_W3, 0).length == pytest.approx(0.5)  # 192 / 384
    assert compute_score(sol, GT_W3, 0, RllaFlags(schedulelength=False)).length == pytest.approx(
        0.38  # round(192 / 512, 2)
    )


def test_env_read_on_every_call(monkeypatch: pytest.MonkeyPatch) -> None:
    sol = tool_answer(PARTIAL)
    assert compute_score(sol, GT_W3).correctness == pytest.approx(1.8)
    monkeypatch.setenv("CORRECTMAX1", "1")
    assert compute_score(sol, GT_W3).correctness == pytest.approx(0.6)
    monkeypatch.setenv("CORRECTMAX1", "true")
    assert compute_score(sol, GT_W3).correctness == pytest.approx(1.8)


def test_flags_resolve() -> None:
    flags = RllaFlags(coarsereward=False, withlength=True).resolve(
        {"COARSEREWARD": "1", "CORRECTMAX1": "1", "REFINEDREWARD": "yes", "WITHLENGTH": "0"}
    )
    assert flags == RllaFlags(
        withlength=True,
        schedulelength=False,
        correctmax1=True,
        max1step30max3=False,
        schedulereward=False,
        refinedreward=False,
        intermediatereward=False,
        coarsereward=False,
    )
    assert RllaFlags().resolve({}) == RllaFlags(*([False] * 8))


# ---------------------------------------------------------------- API details


def test_reward_parts_unpack_and_length_type(monkeypatch: pytest.MonkeyPatch) -> None:
    parts = compute_score(GT_W3, GT_W3)
    total, fmt, correctness, length = parts
    assert isinstance(parts, tuple) and parts == (4.0, 1.0, 3.0, 0)
    assert (parts.total, parts.format, parts.correctness, parts.length) == (
        total,
        fmt,
        correctness,
        0,
    )
    assert type(length) is int  # the original's literal 0 when WITHLENGTH is off
    monkeypatch.setenv("WITHLENGTH", "1")
    assert type(compute_score(GT_W3, GT_W3).length) is float


def test_response_gt_correctness_is_float_zero() -> None:
    gt = "<think> a </think>\n<response> b </response>"
    assert compute_score("junk", gt) == (0.0, 0.0, 0.0, 0)


@pytest.mark.parametrize(
    "gt",
    [
        THINK + "\n<tool_call>\n" + json.dumps(W3) + "\n\n" + json.dumps(W3) + "\n</tool_call>",
        "<think> I will emit <tool_call> now </think>\n<tool_call>\n"
        + json.dumps(W3)
        + "\n</tool_call>",
        tool_answer(json.dumps(W3, indent=2)),
        tool_answer("[1, 2]"),
        tool_answer('{"parameters": {}}'),
        THINK + "\n<tool_call>\n\n</tool_call>",
    ],
    ids=["blank_line", "tag_in_thought", "pretty", "not_dict", "no_name", "empty"],
)
def test_malformed_ground_truth_raises(gt: str) -> None:
    with pytest.raises(ValueError, match="malformed RLLA ground truth"):
        compute_score(GT_W3, gt)


def test_bad_argument_types() -> None:
    with pytest.raises(TypeError):
        compute_score(None, GT_W3)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        compute_score(GT_W3, b"gt")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        compute_score(GT_W3, GT_W3, step="3")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        extract_answer(123)  # type: ignore[arg-type]
    assert compute_score(GT_W3, GT_W3, step=30.0).total == 4.0


def test_no_output(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    for var in FLAG_VARS:
        monkeypatch.setenv(var, "1")
    compute_score(tool_answer(PARTIAL), GT_W3, 40)
    compute_score("garbage", GT_W3, 40)
    assert capsys.readouterr() == ("", "")


def test_parse_tool_calls() -> None:
    assert parse_tool_calls(tool_answer(W3, PARTIAL)) == [W3, PARTIAL]
    assert parse_tool_calls("x <tool_call>" + json.dumps(W3) + "</tool_call> y") == [W3]
    # only the first block; it ends at the next </tool_call> or <tool_call>
    two = tool_answer(W3) + "\n" + tool_answer(PARTIAL)
    assert parse_tool_calls(two) == [W3]
    bad = [
        "no tags",
        "<tool_call>\n" + json.dumps(W3),
        json.dumps(W3) + "\n</tool_call>",
        tool_answer(W3, "", W3),
        tool_answer("[1]"),
        tool_answer('{"parameters": {}}'),
        tool_answer("{'name': 'x'}"),
        tool_answer("[" * 100_000),
    ]
    for text in bad:
        with pytest.raises(ValueError):
            parse_tool_calls(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("  plain answer \n", "plain answer"),
        ("plain<|im_end|>tail", "plain"),  # no start marker: still cut at the end token
        ("plain<|eot_id|>x<|im_end|>", "plain"),
        ("plain<|endoftext|>", "plain<|endoftext|>"),
        ("<|im_start|>assistant\nA<|im_end|>B", "A"),
        ("<|im_start|>assistant\nA<|im_end|><|im_start|>assistant\n B <|im_end|>", "B"),
        ("<|im_start|>assistant\nA<|endoftext|>", "A<|endoftext|>"),
        ("<|im_start|>assistant\nA</s>", "A</s>"),
        ("<|start_header_id|>assistant<|end_header_id|>\n\nA<|eot_id|>B", "A"),
        ("<|im_start|>assistant\nX<|start_header_id|>assistant<|end_header_id|>\n\nA", "A"),
        ("<|start_header_id|>assistant<|end_header_id|>\n\nA<|im_end|>", "A<|im_end|>"),
        # Gemma: a user turn holds the system prompt (no system role), the model turn the answer
        (
            "<bos><start_of_turn>user\nS\n\nQ<end_of_turn>\n<start_of_turn>model\nA<end_of_turn>",
            "A",
        ),
    ],
)
def test_extract_answer(text: str, expected: str) -> None:
    assert extract_answer(text) == expected


# ---------------------------------------------------------------- real RLLA rows


def _rows(name: str) -> list[dict]:
    path = RLLA_DIR / name
    if not path.exists():
        pytest.skip(f"{path} not available")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("name", ["rlla_4k_test.jsonl", "rlla_sample300.jsonl"])
def test_real_ground_truth_copied_scores_max(name: str) -> None:
    for row in _rows(name):
        gt = row["reward_model"]["ground_truth"]
        system, user = (m["content"] for m in row["prompt"])
        sol = (
            f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n"
            f"<|im_start|>assistant\n{gt}<|im_end|>"
        )
        parts = compute_score(sol, gt, step=1)
        expected_correctness = 3.0 if "<tool_call>" in gt else 0.0
        assert (parts.format, parts.correctness) == (1.0, expected_correctness), gt


# ---------------------------------------------------------------- properties

_text = st.text(alphabet="abcxyz_ 019", max_size=6)
_value = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-5, 5)
    | st.floats(allow_nan=False, allow_infinity=False, width=16)
    | _text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
    max_leaves=6,
)
_call = st.fixed_dictionaries(
    {
        "name": st.sampled_from(["f", "g", "h"]),
        "parameters": st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), _value, max_size=3),
    }
)
_calls = st.lists(_call, min_size=1, max_size=4)
_flags = st.builds(RllaFlags, *([st.booleans()] * 8))
_steps = st.sampled_from([0, 1, 29, 30, 75, 105, 150, 300])
_settings = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_settings
@given(gt_calls=_calls, perm=st.randoms(use_true_random=False))
def test_copy_and_permutation_of_t_gt_score_max(gt_calls: list[dict], perm) -> None:
    gt = tool_answer(*gt_calls)
    flags = RllaFlags(*([False] * 8))
    assert compute_score(gt, gt, flags=flags) == (4.0, 1.0, 3.0, 0)
    shuffled = list(gt_calls)
    perm.shuffle(shuffled)
    assert compute_score(tool_answer(*shuffled), gt, flags=flags).correctness == pytest.approx(3.0)


@_settings
@given(gt_calls=_calls, pred_calls=st.lists(_call, max_size=4), flags=_flags, step=_steps)
def test_parts_sum_and_correctness_bounds(gt_calls, pred_calls, flags, step) -> None:
    gt = tool_answer(*gt_calls)
    parts = compute_score(tool_answer(*pred_calls), gt, step, flags)
    assert parts.total == parts.format + parts.correctness + parts.length
    hi = compute_score(gt, gt, step, flags).correctness
    lo = compute_score("no tool call", gt, step, flags).correctness
    assert min(lo, hi) - TOL <= parts.correctness <= max(lo, hi) + TOL
    if flags.withlength:
        assert 0.0 <= parts.length <= 1.0
    else:
        assert parts.length == 0


@_settings
@given(text=st.text(max_size=80), flags=_flags, step=_steps)
def test_arbitrary_answers_never_raise(text: str, flags: RllaFlags, step: int) -> None:
    for gt in (GT_W3, "<think> a </think>\n<response> b </response>", "<think> a </think>"):
        parts = compute_score(text, gt, step, flags)
        assert parts.total == parts.format + parts.correctness + parts.length
