"""Module-level functions for isolated-tool tests: workers import tools by module and name."""

from __future__ import annotations

import os


def worker_pid() -> int:
    """The worker process's pid."""
    return os.getpid()


def spin(seconds: float = 1e9) -> str:
    """Busy forever (or ``seconds`` of CPU), as a runaway tool does.

    Args:
        seconds: CPU seconds to burn.
    """
    import time

    end = time.process_time() + seconds
    while time.process_time() < end:
        pass
    return "done"


def allocate(megabytes: int) -> str:
    """Touch ``megabytes`` of memory.

    Args:
        megabytes: How much.
    """
    block = bytearray(megabytes * 2**20)
    return str(len(block))


def fail() -> str:
    """Raise like a tool given bad input."""
    raise ValueError("bad input")


class Unpicklable(Exception):
    def __init__(self, a: int, b: int) -> None:  # pickling passes only the message: fails
        super().__init__(f"{a}-{b}")


def fail_oddly() -> str:
    """Raise an exception that cannot cross a pipe."""
    raise Unpicklable(1, 2)
