"""A GGUF is converted once per cache, by one process: fsdp2 ranks (or parallel test workers)
resolving the same model wait for the conversion under way and reuse its entry; unlocked, the
second to finish replaced the entry while the first loaded from it (vLLM then refused the
vanished directory at engine start)."""

from __future__ import annotations

import threading
import time

from filelock import FileLock

from toolgrpo.models.registry import cache_entry, convert_gguf


def test_a_conversion_waits_for_the_one_under_way_and_reuses_its_entry(tmp_path, monkeypatch):
    monkeypatch.setenv("TOOLGRPO_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"not a gguf: converting it would fail")
    out = cache_entry(gguf)
    out.parent.mkdir(parents=True)
    got: list[object] = []
    other = FileLock(str(out.with_name(out.name + ".lock")))
    other.acquire()  # another process is converting
    t = threading.Thread(target=lambda: got.append(_call(convert_gguf, gguf)))
    t.start()
    time.sleep(0.5)
    assert t.is_alive() and not got, "converted beside a conversion under way"
    out.mkdir()  # the other process's entry lands
    (out / "config.json").write_text("{}")
    (out / "model.safetensors").write_bytes(b"weights")
    other.release()
    t.join(timeout=30)
    assert got == [out]
    assert (out / "model.safetensors").read_bytes() == b"weights"  # reused, not replaced


def test_a_finished_entry_is_returned_without_the_lock(tmp_path, monkeypatch):
    monkeypatch.setenv("TOOLGRPO_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"x")
    out = cache_entry(gguf)
    out.mkdir(parents=True)
    (out / "config.json").write_text("{}")
    (out / "model.safetensors").write_bytes(b"w")
    with FileLock(str(out.with_name(out.name + ".lock"))):  # held elsewhere: no wait
        assert convert_gguf(gguf) == out


def _call(fn, *args):
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001 - the test reports what the thread raised
        return e
