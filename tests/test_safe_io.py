"""``toolgrpo.safe_io``: the files toolgrpo writes for a user are never written through a
symbolic link, at the destination or at a temporary's name; a refusal is one line naming it."""

from __future__ import annotations

import os
import stat

import pytest

from toolgrpo.errors import UserError
from toolgrpo.safe_io import LinkRefused, open_append, path_kind, refuse_link, write_text


def _victim(tmp_path):
    v = tmp_path / "victim.txt"
    v.write_text("keep me")
    return v


def test_write_text_replaces_atomically_and_leaves_no_temporary(tmp_path):
    out = tmp_path / "a" / "b.json"
    assert write_text(out, "1") == out and out.read_text() == "1"
    write_text(out, "2")
    assert out.read_text() == "2" and sorted(p.name for p in out.parent.iterdir()) == ["b.json"]
    assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~_umask()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_a_link_at_the_destination_is_refused_in_one_line(tmp_path):
    victim = _victim(tmp_path)
    out = tmp_path / "eval.json"
    out.symlink_to(victim)
    with pytest.raises(LinkRefused) as e:
        write_text(out, "{}")
    assert isinstance(e.value, UserError)  # the CLI prints it as one line, exit 2
    assert str(e.value).startswith(f"{out} is a symbolic link (to {victim})")
    assert victim.read_text() == "keep me" and out.is_symlink()
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    with pytest.raises(LinkRefused):
        refuse_link(tmp_path / "dangling")


def test_append_never_follows_a_link(tmp_path):
    victim = _victim(tmp_path)
    log = tmp_path / "run.log"
    log.symlink_to(victim)
    with pytest.raises(LinkRefused, match="run.log is a symbolic link"):
        open_append(log)
    assert victim.read_text() == "keep me"
    with open_append(tmp_path / "fresh.log") as fh:
        fh.write("x\n")
    assert (tmp_path / "fresh.log").read_text() == "x\n"


def test_path_kind_says_what_a_path_is(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert path_kind(fifo) == "a FIFO (named pipe)"
    assert path_kind(tmp_path) == "a directory"
    assert path_kind(tmp_path / "none") == "missing"
    (tmp_path / "f").write_text("")
    assert path_kind(tmp_path / "f") == "a regular file"
