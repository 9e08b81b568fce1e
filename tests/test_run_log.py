"""A quiet console by default: libraries' logs and Python warnings go to <output_dir>/run.log,
toolgrpo's own lines stay on the console (``toolgrpo.run_log``)."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from tests.conftest import train_overrides
from toolgrpo import run_log
from toolgrpo.run_log import ConsoleFilter, RunLog
from toolgrpo.safe_io import LinkRefused

SRC = Path(__file__).resolve().parents[1] / "src"

# toolgrpo's own console lines: the start-up and end summaries, phases, steps, the progress bar
# and its log records (``toolgrpo train`` ends with the summary: no JSON line after it).
OURS = re.compile(
    r"^(toolgrpo|model: |step \d|train |outputs|  |no held-out|best held-out|report: "
    r"|TensorBoard: |(DEBUG|INFO|WARNING|ERROR) toolgrpo)"
)


def _record(name: str, level: int) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, "m", None, None)


def test_console_filter_keeps_ours_and_library_errors():
    quiet = ConsoleFilter(logging.ERROR)
    assert quiet.filter(_record("toolgrpo.trainer.trainer", logging.WARNING))
    assert quiet.filter(_record("vllm.engine", logging.ERROR))
    assert not quiet.filter(_record("vllm.model_executor.models.utils", logging.WARNING))
    assert not quiet.filter(_record("transformers.modeling_utils", logging.INFO))
    assert not quiet.filter(_record("py.warnings", logging.WARNING))
    loud = ConsoleFilter(logging.INFO)  # trainer.verbose / TOOLGRPO_LOG_LEVEL=INFO
    assert loud.filter(_record("vllm.config", logging.INFO))
    assert loud.filter(_record("py.warnings", logging.WARNING))


def test_log_level_env(monkeypatch):
    monkeypatch.delenv(run_log.LEVEL_ENV, raising=False)
    assert run_log.console_level() is None and run_log.console_level(True) == logging.INFO
    monkeypatch.setenv(run_log.LEVEL_ENV, "debug")
    assert run_log.console_level() == logging.DEBUG


def test_run_log_gets_library_records_and_warnings_and_restores(tmp_path, monkeypatch):
    monkeypatch.delenv(run_log.LEVEL_ENV, raising=False)
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    opened = RunLog(tmp_path)
    try:
        logging.getLogger("vllm.config").info("engine config dump")
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.warn("old api", FutureWarning, stacklevel=1)
    finally:
        opened.close()
    text = (tmp_path / "run.log").read_text()
    assert "engine config dump" in text and "FutureWarning: old api" in text
    assert root.level == level and root.handlers == handlers


def test_cli_train_console_is_quiet_and_the_run_log_is_written(tiny_model_dir, tiny_data, tmp_path):
    """A 2-step HF job through the real command line: at most 40 console lines that are not
    toolgrpo's, and the libraries' records in <output_dir>/run.log."""
    out = tmp_path / "run"
    ov = train_overrides(tiny_model_dir, tiny_data, out, 2, **{"trainer.logger": "[console,jsonl]"})
    env = quiet_train_env()
    p = subprocess.run(
        [sys.executable, "-m", "toolgrpo.cli", "train", *ov],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    check_quiet_run(p, out)


def quiet_train_env() -> dict[str, str]:
    """The environment of a ``toolgrpo train`` subprocess, with none of the logging settings a
    test session may carry."""
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
    quiet = ("VLLM_CONFIGURE_LOGGING", "TORCH_LOGS", "VLLM_LOGGING_LEVEL", "TORCH_CPP_LOG_LEVEL")
    for k in (run_log.LEVEL_ENV, "TQDM_DISABLE", *quiet):
        env.pop(k, None)
    return env


def check_quiet_run(p: subprocess.CompletedProcess, out: Path) -> None:
    """At most 40 console lines that are not toolgrpo's, the start-up lines, one line per step,
    and the libraries' records in <output_dir>/run.log."""
    assert p.returncode == 0, p.stderr
    lines = [s for s in (p.stdout + p.stderr).splitlines() if s.strip()]
    foreign = [s for s in lines if not OURS.match(s)]
    assert len(foreign) <= 40, "\n".join(foreign)
    assert any(s.startswith("model: ") for s in lines)  # what runs, said at start
    assert sum(s.startswith("step 1: ") for s in lines) == 1
    assert not any(s.startswith("{") for s in lines)  # the summary ends it, no raw JSON line
    log = out / "run.log"
    assert log.is_file() and "transformers" in log.read_text()


def test_console_floor_is_raised_only_while_a_run_log_is_open(tmp_path, monkeypatch):
    """eval/sft/infer keep library warnings on the console; a training run sends them to its
    log; ``setup_console``'s undo leaves the process as it found it."""
    monkeypatch.delenv(run_log.LEVEL_ENV, raising=False)
    root = logging.getLogger()
    before = list(root.handlers)
    undo = run_log.setup_console()
    try:
        assert run_log._console_filter().floor == logging.WARNING
        opened = RunLog(tmp_path)
        assert run_log._console_filter().floor == logging.ERROR
        opened.close()
        assert run_log._console_filter().floor == logging.WARNING
    finally:
        undo()
    assert root.handlers == before


def test_run_log_is_never_written_through_a_link(tmp_path):
    """A linked run.log is refused with a one-line user error naming it (it used to be a raw
    ``OSError: [Errno 40]`` and a traceback), and its target is untouched."""
    (tmp_path / "elsewhere").write_text("")
    (tmp_path / "run.log").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(LinkRefused, match=r"run\.log is a symbolic link"):
        RunLog(tmp_path).close()
    assert (tmp_path / "elsewhere").read_text() == ""
