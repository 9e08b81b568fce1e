"""How much memory a run holds: logged every step as ``perf/*`` (verl logs ``perf/`` memory too,
of the GPU; here the devices are the CPU's, so it is resident memory).

A run is this process and what it started (vLLM's engine core, FSDP2's other ranks): each one's
peak comes from the kernel (``VmHWM``), so nothing between two steps is missed, and their sum
bounds the run's peak from above (the processes need not peak at the same moment).
"""

from __future__ import annotations

import resource
from pathlib import Path

import psutil

GIB = 1024**3


def _peak_bytes(pid: int) -> int:
    """A process's peak resident set (``VmHWM``), 0 when it is gone or unreadable."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def memory_metrics() -> dict[str, float]:
    """``perf/rss_gb`` (this process and its live descendants now), ``perf/peak_rss_gb`` (the
    sum of their peaks so far: an upper bound of the run's peak) and ``perf/peak_rss_main_gb``
    (this process alone), in GiB."""
    me = psutil.Process()
    try:
        children = me.children(recursive=True)
    except psutil.Error:
        children = []
    now, peaks = me.memory_info().rss, 0
    for c in children:
        try:
            now += c.memory_info().rss
        except psutil.Error:  # ended between the listing and the read
            continue
        peaks += _peak_bytes(c.pid)
    main_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    return {
        "perf/rss_gb": now / GIB,
        "perf/peak_rss_gb": (main_peak + peaks) / GIB,
        "perf/peak_rss_main_gb": main_peak / GIB,
    }
