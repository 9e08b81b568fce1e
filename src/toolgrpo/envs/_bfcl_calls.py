"""BFCL's simulators, driven the way BFCL's own executor drives them, without its ``eval``.

Instances are built and loaded as in ``multi_turn_utils.execute_multi_turn_func_call`` (class from
``CLASS_FILE_PATH_MAPPING``, ``_load_scenario`` on a deep copy of the config unless stateless), but
held by the environment instead of module globals, so episodes never share state. Ground-truth
calls are BFCL's python-syntax strings; they are parsed with ``ast`` (literal arguments only)
rather than evaluated. Only modules that import with ``--no-deps`` are used.
"""

from __future__ import annotations

import ast
import copy
import importlib
import inspect
import json
from typing import Any

from toolgrpo.envs._bfcl_data import BfclEntry

_BACKEND = "bfcl_eval.constants.executable_backend_config"
_CHECKER = "bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker"


def make_instances(entry: BfclEntry) -> dict[str, Any]:
    """Fresh simulators for the entry's classes, loaded with its initial configuration."""
    backend = importlib.import_module(_BACKEND)
    instances = {}
    for class_name in entry.involved_classes:
        module = importlib.import_module(backend.CLASS_FILE_PATH_MAPPING[class_name])
        instance = getattr(module, class_name)()
        if class_name not in backend.STATELESS_CLASSES:
            config = copy.deepcopy(entry.initial_config.get(class_name, {}))
            instance._load_scenario(config, long_context=entry.long_context)
        instances[class_name] = instance
    return instances


def method_owners(instances: dict[str, Any]) -> dict[str, str]:
    """Public method name → class name; on a name clash the later class wins, as in BFCL."""
    owners = {}
    for class_name, instance in instances.items():
        for name, _ in inspect.getmembers(instance, predicate=inspect.ismethod):
            if not name.startswith("_"):
                owners[name] = class_name
    return owners


def call_text(value: Any) -> str:
    """A result as BFCL shows it: strings as is, dicts as JSON when possible, else ``str``."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        try:
            return json.dumps(value)
        except (TypeError, ValueError):
            return str(value)
    return str(value)


def parse_call(source: str) -> tuple[str, list[Any], dict[str, Any]]:
    """``"mv(source='a', destination='b')"`` → ``("mv", [], {"source": "a", ...})``."""
    node = ast.parse(source.strip(), mode="eval").body
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ValueError(f"not a plain function call: {source!r}")
    args = [ast.literal_eval(a) for a in node.args]
    kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg is not None}
    return node.func.id, args, kwargs


def run_ground_truth(instances: dict[str, Any], calls: list[str]) -> list[str]:
    """Execute one turn's ground-truth calls in order; their results as BFCL records them."""
    owners = method_owners(instances)
    results = []
    for source in calls:
        try:
            name, args, kwargs = parse_call(source)
            if name not in owners:
                raise AttributeError(f"no function named {name!r}")
            value = getattr(instances[owners[name]], name)(*args, **kwargs)
            results.append(call_text(value))
        except Exception as e:
            results.append(f"Error during execution: {e}")
    return results


def states_equal(model: dict[str, Any], truth: dict[str, Any]) -> bool:
    """BFCL's state check: every public attribute of every simulator is equal."""
    checker = importlib.import_module(_CHECKER)
    return bool(checker.state_checker(model, truth)["valid"])


def turn_passes(
    model: dict[str, Any],
    truth: dict[str, Any],
    model_calls: int,
    model_results: list[str],
    truth_calls: list[str],
    truth_results: list[str],
) -> bool:
    """One turn as BFCL's multi-turn checker judges it (plus its irrelevance check)."""
    if not truth_calls:
        return model_calls == 0
    if model_calls == 0 or not states_equal(model, truth):
        return False
    checker = importlib.import_module(_CHECKER)
    return bool(checker.response_checker(model_results, truth_results, 0)["valid"])
