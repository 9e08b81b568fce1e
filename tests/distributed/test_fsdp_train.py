"""A 2-rank FSDP2 ``toolgrpo train`` (torchrun, gloo on CPU) killed with SIGKILL and resumed, on
one process and again on two: the metrics stream has each step exactly once (issue #21; before
it, ``trainer.distributed.strategy`` did not exist and the first launch failed)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import read_metrics, train_overrides
from toolgrpo.trainer.checkpoint import list_checkpoints

ROOT = Path(__file__).resolve().parents[2]


def _lines(path: Path) -> int:
    try:
        return sum(1 for line in path.read_text().splitlines() if line.strip())
    except FileNotFoundError:
        return 0


def _cmd(model, data, out, steps: int, ranks: int) -> list[str]:
    extra = {
        "trainer.save_freq": 1,
        "trainer.device": "cpu",
        "data.max_response_length": 16,
        "trainer.distributed.strategy": "fsdp2" if ranks > 1 else "none",
    }
    ov = train_overrides(model, data, out, steps, **extra)
    if ranks == 1:
        return [sys.executable, "-m", "toolgrpo.cli", "train", *ov]
    run = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks)]
    return [*run, "--standalone", "--module", "toolgrpo.cli", "train", *ov]


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants (torchrun starts each rank in a session of its own)."""
    out = [pid]
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            kids = (task / "children").read_text().split()
        except OSError:
            continue
        for k in kids:
            out += _tree(int(k))
    return out


def _kill_all(pids: list[int]) -> None:
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_two_ranks_killed_then_resumed_on_one_and_two(tiny_model_dir, tiny_data, tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    metrics = out / "metrics.jsonl"
    cmd = _cmd(tiny_model_dir, tiny_data, out, 6, 2)
    log = tmp_path / "killed.log"  # a file, not a pipe: two ranks' output would fill a pipe
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log.open("w"),
    )
    try:
        deadline = time.time() + 300
        while _lines(metrics) < 2:
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.time() < deadline, "training never logged two steps"
            time.sleep(0.005)
        _kill_all(_tree(proc.pid))  # the launcher and every rank at once, as on a lost node
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            _kill_all(_tree(proc.pid))
            proc.wait()
    killed_at = [r["step"] for r in read_metrics(out)]
    assert 2 <= len(killed_at) < 6, f"the kill came too late to test anything: {killed_at}"
    assert list_checkpoints(out), "no checkpoint was complete at the kill"

    # The full-state checkpoint loads in one plain process, then two ranks take over again.
    for steps, ranks in ((4, 1), (6, 2)):
        done = subprocess.run(
            _cmd(tiny_model_dir, tiny_data, out, steps, ranks),
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert [r["step"] for r in read_metrics(out)] == list(range(1, steps + 1))
    assert [s for s, _ in list_checkpoints(out)] == [5, 6]
