"""Issue 15 item 2: ``.pt`` checkpoint files are read weights-only; a crafted pickle is refused
with a one-line error before it can run code."""

from __future__ import annotations

import pytest
import torch

from tests.trainer.ckpt_runs import plant
from toolgrpo.models.safe_load import CorruptCheckpoint, UnsafeCheckpoint, load_torch_file


def test_crafted_pickle_is_refused_and_never_runs(tmp_path):
    """Pins: ``torch.load(weights_only=False)`` ran a pickle's ``__reduce__`` payload."""
    marker = tmp_path / "PWNED"
    plant(tmp_path / "optimizer.pt", marker)
    with pytest.raises(UnsafeCheckpoint, match="refused") as err:
        load_torch_file(tmp_path / "optimizer.pt")
    assert "\n" not in str(err.value)
    assert not marker.exists()


def test_plain_state_loads_and_torn_files_are_corrupt(tmp_path):
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.ones(3))], lr=0.1)
    opt.step()
    state = {"optimizer": opt.state_dict(), "kl_coef": 0.1, "value_head": None}
    torch.save(state, tmp_path / "ok.pt")
    got = load_torch_file(tmp_path / "ok.pt")
    assert got["optimizer"]["param_groups"][0]["lr"] == 0.1
    data = (tmp_path / "ok.pt").read_bytes()
    (tmp_path / "torn.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(CorruptCheckpoint, match="unreadable"):
        load_torch_file(tmp_path / "torn.pt")
    with pytest.raises(CorruptCheckpoint, match="missing"):
        load_torch_file(tmp_path / "absent.pt")
