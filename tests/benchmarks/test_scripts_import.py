"""Every benchmark script imports: the names it takes from its neighbours (shared helpers in
``cli_runs``, ``kept``, ``router_budget`` ...) still exist. Nothing runs: ``main`` is not called."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
SCRIPTS = sorted(p.stem for p in BENCH.glob("*.py"))


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_benchmark_script_imports(name, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    monkeypatch.setattr(sys, "argv", [f"{name}.py"])
    module = importlib.import_module(name)
    assert module.__file__ == str(BENCH / f"{name}.py")
