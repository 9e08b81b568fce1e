"""Arithmetic and algebra tasks a small model cannot do in its head, with a calculator to call.

``calculate`` is a bounded expression evaluator (simpleeval with a whitelist of nodes, never
Python ``eval``); ``solve`` parses an equation with sympy after a token whitelist, since sympy's
own parser evaluates code. ``solve`` runs isolated (a worker process killed at the deadline):
sympy can spend minutes holding the GIL on a short input. The reward is exact numeric agreement
of the final ``<answer>``.
"""

from __future__ import annotations

import ast
import math
import operator as op
import re
from collections.abc import Callable, Mapping
from fractions import Fraction
from functools import lru_cache
from typing import Any

from simpleeval import InvalidExpression, SimpleEval

from toolgrpo.data.task import Task
from toolgrpo.envs.base import EnvReward, Transcript
from toolgrpo.envs.registry import EnvConfigError, register_env
from toolgrpo.envs.tool_env import ToolEnv
from toolgrpo.tools.isolated import DEFAULT_MEMORY_LIMIT_MB
from toolgrpo.tools.schema import Tool, function_tool
from toolgrpo.tools.shared_pool import request_workers

SYSTEM_PROMPT = (
    "You are a careful math assistant. Do not compute large numbers in your head: use the tools.\n"
    "To call a tool, write one block per call:\n"
    '<tool_call>{"name": "calculate", "arguments": {"expression": "4817 * 293 - 1205"}}'
    "</tool_call>\n"
    "Tool results come back in the next message. When you know the result, reply with the final "
    "answer only as <answer>NUMBER</answer>."
)

MAX_EXPRESSION_CHARS = 400
MAX_MAGNITUDE = 1e100  # refuse results (and intermediate values) beyond this
MAX_POWER_DIGITS = 100  # refuse a ** b whose result would have more digits than this


def _check(x: Any) -> Any:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise ValueError(f"the result is not a number ({type(x).__name__})")
    if isinstance(x, float) and not math.isfinite(x):
        raise ValueError("result is not finite")
    if abs(x) > MAX_MAGNITUDE:
        raise ValueError(f"result is too large (limit {MAX_MAGNITUDE:g})")
    return x


def _power(a: Any, b: Any) -> Any:
    if a != 0 and b * math.log10(abs(a)) > MAX_POWER_DIGITS:
        raise ValueError(f"{a} ** {b} is too large (limit {MAX_MAGNITUDE:g})")
    return _check(a**b)


def _bounded(fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapped(*args: Any) -> Any:
        return _check(fn(*(_check(a) for a in args)))

    return wrapped


_OPERATORS = {
    **{ast.Add: op.add, ast.Sub: op.sub, ast.Mult: op.mul, ast.Div: op.truediv},
    **{ast.FloorDiv: op.floordiv, ast.Mod: op.mod, ast.USub: op.neg, ast.UAdd: op.pos},
}
_MATH = ("sqrt", "log", "log10", "log2", "exp", "sin", "cos", "tan", "floor", "ceil")
_FUNCTIONS = {"abs": abs, "round": round, "min": min, "max": max}
_FUNCTIONS.update({name: getattr(math, name) for name in _MATH})
_NODES = (ast.BinOp, ast.UnaryOp, ast.Call, ast.Name, ast.Constant)


def _evaluator() -> SimpleEval:
    ops: dict[type, Callable[..., Any]] = {k: _bounded(f) for k, f in _OPERATORS.items()}
    ops[ast.Pow] = _bounded(_power)
    ev = SimpleEval(
        operators=ops,
        functions={k: _bounded(f) for k, f in _FUNCTIONS.items()},
        names={"pi": math.pi, "e": math.e},
    )
    ev.nodes = {k: v for k, v in ev.nodes.items() if k in _NODES}  # no attributes, subscripts...
    return ev


def format_number(x: float | int) -> str:
    """Integers exactly, floats to 12 significant digits (what the model should copy)."""
    if isinstance(x, float) and x.is_integer() and abs(x) < 1e15:
        return str(int(x))
    return str(x) if isinstance(x, int) else format(x, ".12g")


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression exactly, so the model never has to multiply in its head.

    Args:
        expression: Arithmetic such as "4817 * 293 - 1205" or "sqrt(2) * 3". Supports + - * / // %
            ** and parentheses, the functions sqrt, abs, round, min, max, log, log10, log2, exp,
            sin, cos, tan, floor, ceil, and the constants pi and e.
    """
    expression = expression.replace("^", "**").strip()
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression, mode="eval").body
        if isinstance(tree, ast.Tuple):
            raise ValueError("commas only separate function arguments (no thousands separators)")
        return format_number(_check(_evaluator().eval(expression, previously_parsed=tree)))
    except (InvalidExpression, SyntaxError) as e:
        raise ValueError(f"invalid expression {expression!r}: {e}") from None
    except ZeroDivisionError:
        raise ValueError("division by zero") from None
    except (TypeError, ArithmeticError) as e:
        raise ValueError(f"cannot evaluate {expression!r}: {e}") from None


_SOLVE_FUNCTIONS = ("sqrt", "exp", "log", "sin", "cos", "tan", "pi", "E")
_ALLOWED_CHARS = re.compile(r"^[A-Za-z0-9\s.+\-*/^()=]*$")
_MAX_SOLVE_POWER = 6
_MAX_LITERAL_EXPONENT = 300  # sympy builds 10**e exactly: 1e99999 took 4 s, 1e999999 minutes
# A number literal; its exponent in either case and with either sign (sympy reads 1E999999 and
# 1e+999999 as 1e999999 too).
_LITERAL = re.compile(r"\d+(?:\.\d*)?(?:[eE]([+-]?\d+))?")


def _parse_side(text: str, variable: str) -> Any:
    import sympy
    from sympy.parsing.sympy_parser import (
        convert_xor,
        implicit_multiplication_application,
        parse_expr,
        standard_transformations,
    )

    names: dict[str, Any] = {n: getattr(sympy, n) for n in _SOLVE_FUNCTIONS}
    names[variable] = sympy.Symbol(variable, real=True)
    for name in ("Integer", "Float", "Rational", "Symbol", "Function", "Add", "Mul", "Pow"):
        names[name] = getattr(sympy, name)
    names["__builtins__"] = {}
    transformations = (*standard_transformations, implicit_multiplication_application, convert_xor)
    expr = parse_expr(
        text, local_dict={}, global_dict=names, transformations=transformations, evaluate=False
    )
    for p in sympy.preorder_traversal(expr):
        if isinstance(p, sympy.Pow) and not _small_exponent(p.exp):
            raise ValueError(f"only constant exponents up to {_MAX_SOLVE_POWER} are supported")
    return expr


def _small_exponent(e: Any) -> bool:
    """A constant of magnitude <= 6 built without powers (so checking it is cheap)."""
    import sympy

    if e.free_symbols or any(
        isinstance(p, sympy.Pow) and p.exp != -1 for p in sympy.preorder_traversal(e)
    ):
        return False
    return abs(float(e)) <= _MAX_SOLVE_POWER


def solve(equation: str, variable: str = "x") -> str:
    """Solve an equation for one variable, for algebra a small model gets wrong in its head.

    Args:
        equation: An equation such as "7*x - 12 = 37" or "x^2 + 3x - 40 = 0" (without "=",
            the expression is set equal to zero).
        variable: The unknown to solve for, a single letter.
    """
    import sympy

    if not re.fullmatch(r"[a-z]", variable):
        raise ValueError(f"variable must be a single lowercase letter, got {variable!r}")
    if len(equation) > MAX_EXPRESSION_CHARS or not _ALLOWED_CHARS.match(equation):
        raise ValueError("equation may only use numbers, the variable, + - * / ^ ( ) and =")
    for word in re.findall(r"[A-Za-z]\w*", _LITERAL.sub(" ", equation)):
        if word != variable and word not in _SOLVE_FUNCTIONS:
            raise ValueError(f"unknown name {word!r} (the variable is {variable!r})")
    for literal in _LITERAL.finditer(equation):
        if literal[1] and abs(int(literal[1])) > _MAX_LITERAL_EXPONENT:
            raise ValueError(
                f"number {literal[0][:20]!r} is out of range (exponents up to "
                f"{_MAX_LITERAL_EXPONENT} in absolute value)"
            )
    if equation.replace("==", "=").count("=") > 1:
        raise ValueError("an equation has at most one '='")
    lhs, eq, rhs = equation.replace("==", "=").partition("=")
    if not lhs.strip() or (eq and not rhs.strip()):
        raise ValueError("both sides of the equation must be non-empty")
    try:
        left = _parse_side(lhs, variable).doit()
        right = _parse_side(rhs, variable).doit() if eq else sympy.Integer(0)
        x = sympy.Symbol(variable, real=True)
        if (left - right).is_polynomial(x) and sympy.degree(left - right, x) > _MAX_SOLVE_POWER:
            raise ValueError(f"only polynomials up to degree {_MAX_SOLVE_POWER} are supported")
        relation = sympy.Eq(left, right)
        if relation == sympy.true:
            return f"every real {variable} is a solution"
        if relation == sympy.false:
            return f"no real solution for {variable}"
        sols = sympy.solve(relation, x)
    except ValueError:
        raise
    except Exception as e:  # sympy's parser and solver raise many types
        raise ValueError(f"cannot solve {equation!r}: {type(e).__name__}: {e}") from None
    if not sols:
        return f"no real solution for {variable}"
    return "; ".join(f"{variable} = {_show(s)}" for s in sols)


def warm_up_isolated() -> None:
    """Run once in the isolated tools' zygote: sympy's first solve loads much lazily."""
    solve("x^2 + 3x - 40 = 0")


def _show(value: Any) -> str:
    """Exact form, with a decimal approximation when the exact form is not a plain number."""
    if value.is_Float:
        return format_number(float(value))
    exact = str(value)
    if not value.is_number:
        return exact
    approx = format_number(float(value.evalf()))
    return exact if approx == exact else f"{exact} (~ {approx})"


_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def final_answer(messages: list[dict[str, Any]]) -> str | None:
    """The last ``<answer>`` of the last assistant message (earlier turns are scratch work)."""
    for m in reversed(messages):
        if m.get("role") == "assistant":
            found = _ANSWER.findall(m.get("content") or "")
            return found[-1].strip() if found else None
    return None


_THOUSANDS = re.compile(r"^[+-]?\d{1,3}(,\d{3})+(\.\d+)?$")


def parse_number(text: str) -> Fraction | float | None:
    """``1,234``, ``-3/4``, ``2.5``, ``x = 7`` or ``$12.50`` as a number; ``None`` if not one."""
    t = re.sub(r"^[a-z]\s*=\s*", "", text.strip().strip("$").rstrip(".").strip())
    t = t.replace("$", "").replace(" ", "")
    if _THOUSANDS.match(t):
        t = t.replace(",", "")
    try:
        if re.fullmatch(r"[+-]?\d+/\d+", t) or re.fullmatch(r"[+-]?\d+(\.\d+)?", t):
            return Fraction(t)
        value = float(t)
    except (ValueError, ZeroDivisionError):
        return None
    return value if math.isfinite(value) else None


def numbers_match(answer: str, ground_truth: str, rel_tol: float = 1e-6) -> bool:
    got, want = parse_number(answer), parse_number(ground_truth)
    if got is None or want is None:
        return False
    if isinstance(got, Fraction) and isinstance(want, Fraction):
        return got == want or math.isclose(got, want, rel_tol=rel_tol)
    return math.isclose(float(got), float(want), rel_tol=rel_tol, abs_tol=1e-12)


def calculator_reward(transcript: Transcript, ground_truth: str) -> EnvReward:
    answer = final_answer(transcript.messages)
    correct = answer is not None and numbers_match(answer, ground_truth)
    return EnvReward(
        float(correct), {"correct": float(correct), "has_answer": float(answer is not None)}
    )


def with_system(messages: Any, system: str) -> list[dict[str, Any]]:
    """The task's messages behind the environment's system prompt, unless it brings its own."""
    msgs = [dict(m) for m in messages]
    return (
        msgs
        if msgs and msgs[0].get("role") == "system"
        else [{"role": "system", "content": system}, *msgs]
    )


def check_options(env: str, options: Mapping[str, Any], known: tuple[str, ...]) -> None:
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise EnvConfigError(f"unknown {env} option(s) {unknown}; known: {', '.join(known)}")


@lru_cache(maxsize=1)
def calculator_tools() -> tuple[Tool, ...]:
    # calculate is bounded by construction (checked operands, 400 characters): a thread will do
    return function_tool(calculate), function_tool(solve, isolated=True)


OPTIONS = ("timeout_s", "memory_limit_mb", "num_workers")


@register_env("calculator")
def make_calculator_env(task: Task, options: Mapping[str, Any]) -> ToolEnv:
    """Options: ``timeout_s`` per tool call (default 10; ``solve``'s worker is killed at it),
    ``memory_limit_mb`` a ``solve`` call may add to its worker (default 1024; 0 = no limit),
    ``num_workers`` worker processes for isolated tools in this process (default 4)."""
    check_options("calculator", options, OPTIONS)
    timeout_s = _number(options, "timeout_s", 10.0, minimum=0.0)
    memory_limit_mb = _number(options, "memory_limit_mb", DEFAULT_MEMORY_LIMIT_MB, minimum=0.0)
    if "num_workers" in options:
        request_workers(int(_number(options, "num_workers", 0, minimum=1)))
    return ToolEnv(
        with_system(task.messages, SYSTEM_PROMPT),
        calculator_tools(),
        lambda t: calculator_reward(t, task.ground_truth),
        timeout_s=timeout_s,
        memory_limit_mb=memory_limit_mb,
        stateless=True,  # pure tools: rollback needs no state saved
        reward_range=(0.0, 1.0),  # correct or not
    )


def _number(options: Mapping[str, Any], key: str, default: float, minimum: float) -> float:
    value = options.get(key, default)
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if not math.isfinite(number) or number < minimum or isinstance(value, bool):
        raise EnvConfigError(
            f"calculator option {key} must be a number >= {minimum:g}, got {value!r}"
        )
    return number
