"""The ranks' meeting place (``distributed/rank_failure.py``) on an in-memory store, one board per
rank in this process: a meeting names what it waited for and who never came, left or went
silent; the first failure posted is the line every rank raises; a rank busy with its own work is
interrupted at once. The 2-rank runs are in test_fsdp_failures.py."""

from __future__ import annotations

import threading
import time

import pytest
import torch.distributed as dist

from toolgrpo.distributed import rank_failure
from toolgrpo.distributed.rank_failure import RankBoard, RankFailed
from toolgrpo.distributed.ranks import Ranks


def _boards(world: int = 2) -> list[RankBoard]:
    store = dist.HashStore()
    return [RankBoard(store, r, world) for r in range(world)]


def test_a_meeting_names_what_it_waited_for_and_the_rank_that_never_came(monkeypatch):
    monkeypatch.setattr(rank_failure, "MEET_TIMEOUT_S", 0.2)
    zero, one = _boards()
    zero.step = 3
    waited = (
        r"^rank 0 stopped at step 3 waiting for the batch after \d+ s: rank\(s\) \[1\] never came$"
    )
    with pytest.raises(RankFailed, match=waited):
        zero.meet("the batch")
    with pytest.raises(RankFailed, match=waited):  # posted: rank 1 raises the same line
        one.meet("the batch")


def test_a_collective_of_ranks_says_where_the_loop_called_it(monkeypatch):
    monkeypatch.setattr(rank_failure, "MEET_TIMEOUT_S", 0.1)
    zero, _ = _boards()
    ranks = Ranks(0, 2, True, board=zero)
    with pytest.raises(RankFailed, match=r"rank 0's broadcast in test_a_collective_of_ranks_say"):
        ranks.broadcast("tasks")
    assert ranks.at_step(4) == 4 and zero.step == 4


def test_a_rank_that_left_or_went_silent_ends_the_meeting(monkeypatch):
    monkeypatch.setattr(rank_failure, "EXIT_TIMEOUT_S", 0.05)
    zero, one = _boards()
    assert one.leave() is False  # rank 0 never left: rank 1 gives up waiting
    with pytest.raises(RankFailed, match=r"waiting for the gather: rank 1 left the run$"):
        zero.meet("the gather")
    monkeypatch.setattr(rank_failure, "SILENT_S", 0.5)
    zero, _ = _boards()
    t0 = time.monotonic()
    with pytest.raises(RankFailed, match=r"rank 1 went silent \(no heartbeat for 0.5 s\)"):
        zero.meet("the gather")
    assert time.monotonic() - t0 < 5


def test_the_first_failure_posted_is_every_ranks_line():
    zero, one = _boards()
    one.step = zero.step = 2
    boom = ValueError("boom")
    first = one.fail(boom)
    assert str(first) == "rank 1 failed at step 2: ValueError: boom" and first.__cause__ is boom
    # rank 0's own error (the connection to rank 1 broke) gives way to rank 1's line
    later = zero.fail(RuntimeError("Connection closed by peer"))
    assert str(later) == str(first)
    with pytest.raises(RankFailed, match="^rank 1 failed at step 2: ValueError: boom$"):
        zero.meet("the batch")
    assert one.fail(later) is later  # a RankFailed is passed on as it is


def test_a_failure_before_the_first_step_says_so():
    zero, _ = _boards()
    assert str(zero.fail(KeyError("model"))) == "rank 0 failed before step 1: KeyError: 'model'"


@pytest.mark.skipif(rank_failure.SIGNUM is None, reason="no SIGUSR1 on this platform")
def test_a_rank_busy_with_its_own_work_is_interrupted_at_once(monkeypatch):
    monkeypatch.setattr(rank_failure, "EXIT_AFTER_FAILURE_S", 0.05)
    assert threading.current_thread() is threading.main_thread()
    zero, one = _boards()
    zero.start()
    try:
        one.step = 5
        one.fail(OSError("disk full"))
        t0 = time.monotonic()
        with pytest.raises(RankFailed, match="^rank 1 failed at step 5: OSError: disk full$"):
            time.sleep(10)  # rank 0's own work: its share of the rollout
        assert time.monotonic() - t0 < 3
    finally:
        assert zero.leave() is False  # rank 1 never leaves here
    assert not rank_failure._active  # a late signal finds no board
