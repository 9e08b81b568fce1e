"""ToolRL's RLLA reward (``verl/utils/reward_score/rlla.py``), re-implemented from its spec.

``compute_score(solution_str, ground_truth, step)`` returns ``RewardParts(total, format,
correctness, length)`` with the same numbers as the original, quirks included (see
``shared/notes/toolrl_reward.md`` sections 1-6). Differences, all deliberate:

- the chat template is detected from the markers in ``solution_str`` rather than from the
  ``EXPERIMENT_NAME`` env var (see :func:`extract_answer`);
- a malformed ground truth raises ``ValueError("malformed RLLA ground truth: ...")``;
- nothing is printed.
"""

from __future__ import annotations

import json
import re
from numbers import Real
from typing import Any

from toolgrpo.rewards._rlla_match import list_match, score_tool_calls
from toolgrpo.rewards.types import RewardParts, RllaFlags

__all__ = [
    "RewardParts",
    "RllaFlags",
    "compute_score",
    "extract_answer",
    "ground_truth_type",
    "list_match",
    "parse_tool_calls",
]

LLAMA_ASSISTANT = "<|start_header_id|>assistant<|end_header_id|>"
LLAMA_END = "<|eot_id|>"
CHATML_ASSISTANT = "<|im_start|>assistant"
CHATML_END = "<|im_end|>"
# Gemma's template (an addition to ToolRL's two): model turns open with this and end with
# <end_of_turn>; without it a Gemma prompt+response had no marker and was scored whole.
GEMMA_ASSISTANT = "<start_of_turn>model"
GEMMA_END = "<end_of_turn>"

TOOL_OPEN = "<tool_call>"
TOOL_CLOSE = "</tool_call>"
RESPONSE_OPEN = "<response>"
RESPONSE_CLOSE = "</response>"
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"

# Per GT type: the anchored pattern the whole answer must match, and the tags that must occur
# exactly once. <think> tags are never counted.
_FORMAT_RULES: dict[str, tuple[re.Pattern[str], tuple[str, ...]]] = {
    "R": (
        re.compile(r"^<think>.*?</think>\n<response>.*?</response>$", re.DOTALL),
        (RESPONSE_OPEN, RESPONSE_CLOSE),
    ),
    "T": (
        re.compile(r"^<think>.*?</think>\n<tool_call>\n.*?\n</tool_call>$", re.DOTALL),
        (TOOL_OPEN, TOOL_CLOSE),
    ),
    "TR": (
        re.compile(
            r"^<think>.*?</think>\n<tool_call>\n.*?\n</tool_call>\n<response>.*?</response>$",
            re.DOTALL,
        ),
        (TOOL_OPEN, TOOL_CLOSE, RESPONSE_OPEN, RESPONSE_CLOSE),
    ),
    "N": (re.compile(r"^<think>.*?</think>$", re.DOTALL), ()),
}

FORMAT_MAX, FORMAT_MIN = 1.0, 0.0
CORRECT_MAX, CORRECT_MIN = 3.0, -3.0
CORRECT_MAX1_MAX, CORRECT_MAX1_MIN = 1.0, -1.0
LENGTH_MAX, LENGTH_MIN = 1.0, 0.0
LENGTH_TARGET_WORDS = 512


def _require_str(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, got {type(value).__name__}")
    return value


def extract_answer(solution_str: str) -> str:
    """The assistant's answer inside a decoded prompt+response, as ToolRL's reward sees it.

    Llama-3 (``<|start_header_id|>assistant<|end_header_id|>``, checked first): the text after
    the last marker, up to the first ``<|eot_id|>`` after it (or the end if there is none).
    ChatML (``<|im_start|>assistant``): the same with ``<|im_end|>``; Gemma
    (``<start_of_turn>model``, not in the original): with ``<end_of_turn>``. Without a start
    marker the original still cut at its template's end token, so a bare response is cut at the
    first ``<|eot_id|>`` if present, else at the first ``<|im_end|>``. The result is stripped.
    Other end tokens (``<|endoftext|>``, ``</s>``, ...) are NOT removed, as in the original.
    """
    text = _require_str(solution_str, "solution_str")
    if LLAMA_ASSISTANT in text:
        text = text.rsplit(LLAMA_ASSISTANT, 1)[1].split(LLAMA_END, 1)[0]
    elif CHATML_ASSISTANT in text:
        text = text.rsplit(CHATML_ASSISTANT, 1)[1].split(CHATML_END, 1)[0]
    elif GEMMA_ASSISTANT in text:
        text = text.rsplit(GEMMA_ASSISTANT, 1)[1].split(GEMMA_END, 1)[0]
    elif LLAMA_END in text:
        text = text.split(LLAMA_END, 1)[0]
    else:
        text = text.split(CHATML_END, 1)[0]
    return text.strip()


def ground_truth_type(ground_truth: str) -> str:
    """GT kind "R", "T", "TR" or "N" by substring tests over the whole GT (thought included)."""
    has_call = TOOL_OPEN in ground_truth
    has_response = RESPONSE_OPEN in ground_truth
    if has_call:
        return "TR" if has_response else "T"
    return "R" if has_response else "N"


def _block_lines(text: str, require_close: bool) -> list[str]:
    """Lines of the first <tool_call> block: up to the next </tool_call> or <tool_call>."""
    _, found, rest = text.partition(TOOL_OPEN)
    if not found:
        raise ValueError(f"no {TOOL_OPEN} in text")
    if require_close and TOOL_CLOSE not in text:
        raise ValueError(f"no {TOOL_CLOSE} in text")
    body = rest.split(TOOL_OPEN, 1)[0].split(TOOL_CLOSE, 1)[0]
    return body.strip().split("\n")


def _load_calls(lines: list[str]) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []
    for number, line in enumerate(lines, 1):
        try:
            call = json.loads(line)
        except (ValueError, RecursionError) as exc:
            raise ValueError(
                f"tool-call line {number} is not valid JSON ({exc}): {line!r}"
            ) from exc
        if not isinstance(call, dict) or "name" not in call:
            raise ValueError(f"tool-call line {number} is not a JSON object with 'name': {line!r}")
        calls.append(call)
    return calls


def parse_tool_calls(text: str) -> list[dict]:
    """Parse the first <tool_call> block of ``text`` the way the RLLA reward parses answers.

    Both tags must occur somewhere in ``text``. The block runs from the first ``<tool_call>`` to
    the next ``</tool_call>`` (or the next ``<tool_call>``, whichever comes first); it is
    stripped and each ``\\n``-separated line must be one JSON object with a ``name``.
    Raises ``ValueError`` otherwise (blank lines, pretty-printed JSON, ...).
    """
    return _load_calls(_block_lines(_require_str(text, "text"), require_close=True))


def _parse_ground_truth(ground_truth: str) -> list[dict[str, Any]]:
    """GT calls; unlike answers, a missing </tool_call> is tolerated (the block runs to the end)."""
    try:
        return _load_calls(_block_lines(ground_truth, require_close=False))
    except ValueError as exc:
        raise ValueError(f"malformed RLLA ground truth: {exc}") from exc


def _format_bounds(step: float, flags: RllaFlags) -> tuple[float, float]:
    """(max, min) of the format reward after MAX1STEP30MAX3, then SCHEDULEREWARD."""
    hi, lo = FORMAT_MAX, FORMAT_MIN
    if flags.max1step30max3 and step >= 30:
        hi = hi / 2
        lo = lo / 2
    if flags.schedulereward:
        hi = 2 - (2 - hi) * step / 150
        lo = -2 + (2 + lo) * step / 150
        if hi < 1.0:
            hi = 1.0
        if lo > -1.0:
            lo = -1.0
    return hi, lo


def _correctness_bounds(step: float, flags: RllaFlags) -> tuple[float, float]:
    """(max, min) of correctness after CORRECTMAX1, then MAX1STEP30MAX3, then SCHEDULEREWARD."""
    if flags.correctmax1:
        hi, lo = CORRECT_MAX1_MAX, CORRECT_MAX1_MIN
    else:
        hi, lo = CORRECT_MAX, CORRECT_MIN
    if flags.max1step30max3 and step < 30:
        hi = hi / 3
        lo = lo / 3
    if flags.schedulereward:
        hi = (hi - 2) * step / 150 + 2
        lo = (lo + 2) * step / 150 - 2
        if hi > 3.0:
            hi = 3.0
        if lo < -3.0:
            lo = -3.0
    return hi, lo


def _format_reward(answer: str, gt_type: str, step: float, flags: RllaFlags) -> float:
    """Format max if the answer has the block layout the GT type demands, else format min."""
    hi, lo = _format_bounds(step, flags)
    pattern, counted_tags = _FORMAT_RULES[gt_type]
    if pattern.search(answer) and all(answer.count(tag) == 1 for tag in counted_tags):
        return hi
    return lo


def _correctness_reward(answer: str, ground_truth: str, step: float, flags: RllaFlags) -> float:
    """0.0 for GTs without tool calls; otherwise the tool-call match mapped into its bounds."""
    hi, lo = _correctness_bounds(step, flags)
    if TOOL_OPEN not in ground_truth:
        return 0.0
    gt_calls = _parse_ground_truth(ground_truth)  # outside the catch-all, as in the original
    try:
        pred_calls = parse_tool_calls(answer)
        return score_tool_calls(
            gt_calls,
            pred_calls,
            hi,
            lo,
            refined=flags.refinedreward,
            intermediate=flags.intermediatereward,
            coarse=flags.coarsereward,
        )
    except Exception:  # the original gives min on any failure while scoring the prediction
        return lo


def _length_reward(answer: str, step: float, flags: RllaFlags) -> float:
    """Words in the last thought over a target length, rounded to 2 places and then capped at 1."""
    if THINK_OPEN not in answer or THINK_CLOSE not in answer:
        return LENGTH_MIN
    if flags.schedulelength:
        target = (640 - 384) * step / 105 + 384  # not capped: keeps growing past step 105
    else:
        target = LENGTH_TARGET_WORDS
    thought = answer.split(THINK_OPEN)[-1].split(THINK_CLOSE, 1)[0].strip()
    ratio = round(len(thought.split()) / target, 2)
    if ratio > 1.0:
        ratio = 1.0
    return ratio * (LENGTH_MAX - LENGTH_MIN) + LENGTH_MIN


def compute_score(
    solution_str: str,
    ground_truth: str,
    step: int = 0,
    flags: RllaFlags | None = None,
) -> RewardParts:
    """Score one decoded sequence against an RLLA ground truth, exactly like ToolRL.

    ``flags=None`` (or any field left ``None``) reads the flag env vars on every call.
    Raises ``ValueError`` for a malformed ground truth and ``TypeError`` for non-str inputs.
    """
    _require_str(solution_str, "solution_str")
    _require_str(ground_truth, "ground_truth")
    if isinstance(step, bool) or not isinstance(step, Real):
        raise TypeError(f"step must be a number, got {type(step).__name__}")
    resolved = (flags if flags is not None else RllaFlags()).resolve()

    answer = extract_answer(solution_str)
    fmt = _format_reward(answer, ground_truth_type(ground_truth), step, resolved)
    correctness = _correctness_reward(answer, ground_truth, step, resolved)
    length: float = _length_reward(answer, step, resolved) if resolved.withlength else 0
    return RewardParts(fmt + correctness + length, fmt, correctness, length)
