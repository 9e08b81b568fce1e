"""What ``toolgrpo eval`` writes is the user's: never through a link, never beside another
writer. A linked ``eval.json`` is refused (it used to have its target replaced); a second eval on
one output, or an eval into a run directory a live trainer holds, stops in one line (both used to
print "wrote .../eval.json", one result silently lost)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.probes.conftest import one_error_line
from toolgrpo.cli import main

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
HOLD = (
    "import sys, time; from pathlib import Path; from toolgrpo.trainer.run_lock import "
    "lock_run_dir; lock = lock_run_dir(Path(sys.argv[1])); print('held', flush=True); "
    "time.sleep(600)"
)


def _eval(model_dir, data, *extra: str) -> list[str]:
    return [
        "eval",
        *extra,
        f"actor_rollout_ref.model.path={model_dir}",
        "actor_rollout_ref.model.dtype=float32",
        f"data.val_files=[{data}]",
        "data.max_response_length=8",
    ]


@pytest.fixture
def holder(tmp_path):
    """``holder(dir)``: another process holding ``dir`` as a live trainer (or eval) does."""
    procs = []

    def hold(where: Path) -> int:
        p = subprocess.Popen(
            [sys.executable, "-c", HOLD, str(where)], cwd=ROOT, env=ENV, stdout=subprocess.PIPE
        )
        procs.append(p)
        assert p.stdout.readline().strip() == b"held"
        return p.pid

    yield hold
    for p in procs:
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=60)


def test_a_linked_eval_json_is_refused_before_the_model_loads(
    tiny_model_dir, tiny_data, tmp_path, capsys, no_model
):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    out = tmp_path / "run"
    out.mkdir()
    (out / "eval.json").symlink_to(victim)
    assert main(_eval(tiny_model_dir, tiny_data, f"trainer.output_dir={out}")) == 2
    assert "eval.json is a symbolic link" in one_error_line(capsys.readouterr().err, "eval")
    assert victim.read_text() == "keep me"


def test_a_second_eval_on_one_output_stops_in_one_line(
    tiny_model_dir, tiny_data, tmp_path, capsys, holder, no_model
):
    out = tmp_path / "evals" / "e.json"
    pid = holder(out.parent)  # the first eval
    assert main(_eval(tiny_model_dir, tiny_data, "--output", str(out))) == 2
    line = one_error_line(capsys.readouterr().err, "eval")
    assert f"(pid {pid}) is writing {out.parent}" in line and "--output" in line
    assert not out.exists()


def test_eval_dumps_into_a_live_trainers_run_are_refused(
    tiny_model_dir, tiny_data, tmp_path, capsys, holder, no_model
):
    run = tmp_path / "run"
    pid = holder(run)  # a live trainer, which has written its config
    (run / "config.yaml").write_text("trainer: {}\n")
    argv = ["--output", str(tmp_path / "e.json"), "--rollout-data-dir", str(run / "rollout_data")]
    assert main(_eval(tiny_model_dir, tiny_data, *argv)) == 2
    line = one_error_line(capsys.readouterr().err, "eval")
    assert f"inside {run}, which another toolgrpo process (pid {pid})" in line
    assert "--rollout-data-dir" in line and not (run / "rollout_data").exists()
