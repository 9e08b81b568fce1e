"""Memory metrics count the processes a run starts (vLLM's engine core, other ranks), not only
the trainer's own."""

from __future__ import annotations

import subprocess
import sys
import time

from toolgrpo.trainer.perf import memory_metrics

HOLD = (
    "import time; b = bytearray(400 * 1024 * 1024); b[::4096] = b'x' * len(b[::4096]); "
    "time.sleep(60)"
)


def test_a_child_process_counts_in_now_and_in_peak() -> None:
    before = memory_metrics()
    assert before["perf/peak_rss_gb"] >= before["perf/peak_rss_main_gb"] > 0
    child = subprocess.Popen([sys.executable, "-c", HOLD], stdout=subprocess.PIPE)
    try:
        for _ in range(200):  # until the child holds its 400 MiB (bounded wait)
            held = memory_metrics()
            if held["perf/rss_gb"] - before["perf/rss_gb"] > 0.35:
                break
            time.sleep(0.05)
        assert held["perf/rss_gb"] - before["perf/rss_gb"] > 0.35
        assert held["perf/peak_rss_gb"] - before["perf/peak_rss_gb"] > 0.35
        # the child's memory is not this process's
        assert held["perf/peak_rss_main_gb"] - before["perf/peak_rss_main_gb"] < 0.2
    finally:
        child.kill()
        child.wait()
    after = memory_metrics()
    assert after["perf/rss_gb"] - before["perf/rss_gb"] < 0.2  # a finished child no longer counts
