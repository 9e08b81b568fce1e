"""A quiet console, a complete run log.

Libraries (vLLM, transformers, torch, Ray, httpx, ...) log hundreds of start-up lines that bury
toolgrpo's own. While a run log is open (every command that starts a model: ``train`` and
``sft`` in their output directory, ``eval`` beside its JSON, ``infer`` in ``trainer.output_dir``)
the console shows toolgrpo's lines and the libraries' errors only; everything, library INFO and
Python warnings included, goes to ``run.log`` (commands without one keep library warnings on the
console). ``trainer.verbose`` (or ``toolgrpo -v``, or ``TOOLGRPO_LOG_LEVEL=INFO|DEBUG``) brings
the libraries back to the console.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from toolgrpo.safe_io import open_append

LEVEL_ENV = "TOOLGRPO_LOG_LEVEL"
LOG_NAME = "run.log"
# Libraries that install a stderr handler of their own and stop propagation: while a run log is
# open their records go through the root logger instead (and back at close). torch's logging
# re-installs its handlers, so it is quieted by TORCH_LOGS instead (``quiet_libraries``).
OWN_HANDLERS = ("transformers",)
LIBRARIES = ("vllm", "ray", "transformers", "httpx", "httpcore", "bm25s", "urllib3")


def console_level(verbose: bool = False) -> int | None:
    """The level library records need to reach the console, or None when they are kept off it
    (the default: in the run log only, errors excepted)."""
    name = os.environ.get(LEVEL_ENV, "").strip().upper()
    if name:
        level = logging.getLevelName(name)
        if isinstance(level, int):
            return level
    return logging.INFO if verbose else None


def quiet_libraries(verbose: bool = False) -> None:
    """Environment read by libraries at import, so set before ``import vllm``: vLLM then leaves
    its logger to the root one (run log, console filter). Values already set win."""
    level = console_level(verbose)
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", logging.getLevelName(level or logging.WARNING))
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    if level is None:  # torch's own stderr handler: errors only (read at ``import torch``)
        os.environ.setdefault("TORCH_LOGS", "-all")
        # torch's C++ warnings (``[W ... utils.cpp] Warning: NUMA binding ...``) skip logging
        os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
        # tqdm bars written straight to stderr (transformers' GGUF conversion, vLLM's loaders);
        # read when tqdm is first imported
        os.environ.setdefault("TQDM_DISABLE", "1")


class ConsoleFilter(logging.Filter):
    """toolgrpo's records at the console handler's level; other libraries' from ``floor`` up;
    Python warnings (DeprecationWarning, FutureWarning ...) only when the floor admits them."""

    def __init__(self, floor: int) -> None:
        super().__init__()
        self.floor = floor

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == "toolgrpo" or record.name.startswith("toolgrpo."):
            return True
        if record.name == "py.warnings":
            return self.floor <= logging.WARNING
        return record.levelno >= self.floor


def _console_handler() -> logging.Handler | None:
    for h in logging.getLogger().handlers:
        if getattr(h, "_toolgrpo_console", False):
            return h
    return None


def cli_verbose() -> bool:
    """Whether the CLI's console was set up verbose (``toolgrpo -v``)."""
    return bool(getattr(_console_handler(), "_toolgrpo_verbose", False))


def _console_filter() -> ConsoleFilter | None:
    handler = _console_handler()
    found = [f for f in (handler.filters if handler else []) if isinstance(f, ConsoleFilter)]
    return found[0] if found else None


class _Stderr(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time (pytest swaps it per test)."""

    @property  # type: ignore[override]
    def stream(self) -> object:
        return sys.stderr

    @stream.setter
    def stream(self, value: object) -> None:
        pass


def setup_console(verbose: bool = False) -> Callable[[], None]:
    """The CLI's stderr handler on the root logger: toolgrpo's warnings (INFO when verbose),
    libraries' errors only unless verbose; Python warnings go through logging. Returns what
    undoes it (for callers in a process that goes on: tests)."""
    level = console_level(verbose)
    root = logging.getLogger()
    handler = _console_handler()
    undo: Callable[[], None] = _nothing  # called again (trainer.verbose): the first call undoes
    if handler is None:
        handler = _Stderr()
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        handler._toolgrpo_console = True  # type: ignore[attr-defined]
        root.addHandler(handler)
        undo = _undo(root, handler, root.level)
    # ``toolgrpo -v``: a run log opened later keeps the libraries on the console
    handler._toolgrpo_verbose = verbose  # type: ignore[attr-defined]
    handler.setLevel(min(level or logging.WARNING, logging.INFO if verbose else logging.WARNING))
    for f in list(handler.filters):
        handler.removeFilter(f)
    # Without a run log (report, label) library warnings stay; RunLog raises this to ERROR.
    handler.addFilter(ConsoleFilter(logging.WARNING if level is None else level))
    root.setLevel(min(root.level or logging.WARNING, handler.level))
    quiet_libraries(verbose)
    return undo


def capture_warnings() -> bool:
    """Python warnings through logging (``py.warnings``); whether this call turned that on."""
    if warnings.showwarning is getattr(logging, "_showwarning", None):
        return False
    # logging may think it captures while ``warnings.catch_warnings`` restored showwarning
    logging._warnings_showwarning = None  # type: ignore[attr-defined]
    logging.captureWarnings(True)
    return True


def _nothing() -> None:
    pass


def _undo(root: logging.Logger, handler: logging.Handler, level: int) -> Callable[[], None]:
    captured = capture_warnings()

    def undo() -> None:
        root.removeHandler(handler)
        root.setLevel(level)
        if captured:
            logging.captureWarnings(False)

    return undo


class _NoLinkFileHandler(logging.FileHandler):
    """Appends, never through a link (``safe_io``: a linked run.log is refused in one line)."""

    def _open(self) -> Any:
        return open_append(self.baseFilename, encoding=self.encoding or "utf-8")

    def handleError(self, record: logging.LogRecord) -> None:
        """A full disk: said once, in one line, by the run's own writes; no traceback per record."""


class RunLog:
    """``<out>/run.log``: every record at INFO (DEBUG with ``TOOLGRPO_LOG_LEVEL=DEBUG``) while
    open; ``close()`` puts the loggers it changed back."""

    def __init__(self, out: Path, verbose: bool = False) -> None:
        verbose = verbose or cli_verbose()
        quiet_libraries(verbose)
        if verbose and _console_handler() is not None:  # trainer.verbose: louder CLI console
            setup_console(True)
        level = min(console_level(verbose) or logging.INFO, logging.INFO)
        out.mkdir(parents=True, exist_ok=True)
        self.path = out / LOG_NAME
        self.handler = _NoLinkFileHandler(self.path, encoding="utf-8")
        self.handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
        )
        self.handler.setLevel(level)
        root = logging.getLogger()
        self._saved: list[tuple[logging.Logger, int, bool, list[logging.Handler]]] = []
        self._save(root)
        root.addHandler(self.handler)
        root.setLevel(min(root.getEffectiveLevel(), level))
        self._captured = capture_warnings()
        cli = _console_handler() is not None
        for name in LIBRARIES:
            lib = logging.getLogger(name)
            if name in OWN_HANDLERS and not cli:
                continue  # a library caller's own setup: its handler would print INFO
            self._save(lib)
            if lib.level > level:  # a library that set itself to WARNING: INFO to the file too
                lib.setLevel(level)
            if name in OWN_HANDLERS:
                for h in list(lib.handlers):
                    lib.removeHandler(h)
                lib.propagate = True
        self._filter: ConsoleFilter | None = None
        if cli and console_level(verbose) is None:  # all in the file: errors only on the console
            self._filter = _console_filter()
            self._floor = self._filter.floor if self._filter else logging.WARNING
            if self._filter is not None:
                self._filter.floor = logging.ERROR
            _hide_progress_bars()

    def _save(self, lg: logging.Logger) -> None:
        self._saved.append((lg, lg.level, lg.propagate, list(lg.handlers)))

    def close(self) -> None:
        root = logging.getLogger()
        root.removeHandler(self.handler)
        self.handler.close()
        for lg, level, propagate, handlers in reversed(self._saved):
            lg.setLevel(level)
            lg.propagate = propagate
            for h in handlers:
                if h not in lg.handlers:
                    lg.addHandler(h)
        if self._captured:
            logging.captureWarnings(False)
        if self._filter is not None:
            self._filter.floor = self._floor


def _hide_progress_bars() -> None:
    """transformers' and the Hub's tqdm bars (loading and writing shards) write to stderr
    directly, not through logging."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except ImportError:
        pass
