"""Where a run starts, shared by GRPO and SFT: an output directory holding an earlier run is
resumed, refused, or moved aside (never deleted), and resume takes the newest intact checkpoint,
setting corrupt newer ones aside. Every decision is printed: a run never changes course silently."""

from __future__ import annotations

import sys
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

import yaml

from toolgrpo.config.loader import ConfigError
from toolgrpo.models.safe_load import CheckpointError, CorruptCheckpoint
from toolgrpo.trainer.checkpoint import STATE_FILE, STEP_DIR, checkpoint_root
from toolgrpo.trainer.config_diff import Change, config_changes
from toolgrpo.trainer.run_dir import refuse_links, resolve_output_dir
from toolgrpo.trainer.run_lock import RunLock, lock_run_dir

T = TypeVar("T")
RUN_FILES = ("metrics.jsonl", "sft_result.json")  # written only by a run that took steps


def notice(msg: str) -> None:
    """On the console whatever the log level (the CLI shows warnings only, without -v)."""
    print(f"toolgrpo: {msg}", file=sys.stderr, flush=True)


def earlier_run(out: Path) -> list[str]:
    """What in ``out`` belongs to a run that already took steps."""
    found = []
    root = checkpoint_root(out)
    if root.is_dir() and any(STEP_DIR.match(d.name) for d in root.iterdir()):
        found.append("checkpoints/")
    found += [n for n in RUN_FILES if (out / n).is_file() and (out / n).stat().st_size > 0]
    return found


def _inside(p: Path, out: Path) -> bool:
    return p.resolve().is_relative_to(out.resolve())


def _free_name(base: Path) -> Path:
    dest, n = base, 1
    while dest.exists():
        dest, n = base.with_name(f"{base.name}-{n}"), n + 1
    return dest


def move_aside(out: Path) -> Path:
    """Rename ``out`` to ``<out>.old-<UTC time>``: the earlier run stays whole."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = out.resolve()
    dest = _free_name(out.with_name(f"{out.name}.old-{stamp}"))
    try:
        out.rename(dest)
    except OSError as e:
        raise ConfigError(f"cannot move {out} aside to {dest}: {e.strerror or e}") from None
    return dest


def _saved_yaml(out: Path) -> dict[str, Any] | None:
    try:
        saved = yaml.safe_load((out / "config.yaml").read_text())
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        return None
    return saved if isinstance(saved, dict) else None


def prepare_output_dir(
    out: Path, resume: str, overwrite: bool, current: dict[str, Any]
) -> tuple[Path, RunLock]:
    """The run's real directory, held by this process (``run_lock``): refuse to write over
    another run unless ``overwrite`` (then move it aside). With ``resume=auto`` and no
    checkpoint, a run with the same config restarts from step 0. ``out`` is resolved here,
    once: a symlinked directory is the directory it names, and links inside it are refused."""
    explicit = resume not in ("auto", "disable")
    if explicit and not (Path(resume) / STATE_FILE).is_file():
        raise FileNotFoundError(f"trainer.resume={resume!r} is not a checkpoint directory")
    out = resolve_output_dir(out)
    refuse_links(out)
    lock = lock_run_dir(out)  # before anything is read or moved: another writer is refused
    held = earlier_run(out)
    if held and overwrite:
        if explicit and _inside(Path(resume), out):
            raise ConfigError(
                f"trainer.overwrite_output_dir=true moves {out} aside, so trainer.resume={resume} "
                "inside it cannot be used: point trainer.resume at the moved copy, or drop one"
            )
        dest = move_aside(out)
        lock.release()  # the moved run's lock file went with it: hold the new directory
        lock = lock_run_dir(out)
        notice(f"trainer.overwrite_output_dir: moved the earlier run in {out} aside to {dest}")
    elif held and (resume == "disable" or (explicit and not _inside(Path(resume), out))):
        raise ConfigError(
            f"{out} holds another run ({', '.join(held)}) that trainer.resume={resume} would "
            "write over: choose a new trainer.output_dir, or set "
            "trainer.overwrite_output_dir=true to move it aside"
        )
    elif held and resume == "auto" and "checkpoints/" not in held:
        saved = _saved_yaml(out)
        changed = [c.key for c in config_changes(saved, current)] if saved else ["config.yaml"]
        if changed:
            raise ConfigError(
                f"{out} holds another run ({', '.join(held)}) with no checkpoint and a different "
                f"config ({', '.join(changed[:5])}): choose a new trainer.output_dir, or set "
                "trainer.overwrite_output_dir=true to move it aside"
            )
        notice(f"{out} holds a run with this config but no checkpoint: starting it over at step 0")
    out.mkdir(parents=True, exist_ok=True)
    return out, lock


def _step_dirs(out: Path) -> list[tuple[int, Path]]:
    """Every ``global_step_N`` directory, newest first (complete or not)."""
    root = checkpoint_root(out)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), d) for d in root.iterdir() if (m := STEP_DIR.match(d.name))]
    return sorted(found, reverse=True)


def pick_checkpoint(out: Path, resume: str, read: Callable[[Path], T]) -> tuple[Path, T] | None:
    """The checkpoint to resume from and what ``read`` made of it. ``auto`` falls back past
    corrupt checkpoints (moved to ``<name>.corrupt``); an unsafe file is never skipped over."""
    if resume == "disable":
        return None
    if resume != "auto":
        p = Path(resume)
        if not (p / STATE_FILE).is_file():
            raise FileNotFoundError(f"trainer.resume={resume!r} is not a checkpoint directory")
        return p, read(p)
    bad: list[tuple[Path, CheckpointError]] = []
    for _, d in _step_dirs(out):
        try:
            got = read(d) if (d / STATE_FILE).is_file() else _incomplete(d)
        except CorruptCheckpoint as e:
            notice(f"checkpoint {d.name} is unusable: {e}")
            bad.append((d, e))
            continue
        for b, _ in bad:  # out of the way of pruning and of later resumes, but kept
            aside = _free_name(b.with_name(b.name + ".corrupt"))
            b.rename(aside)
            notice(f"moved {b.name} aside to {aside.name}; resuming from {d.name} instead")
        return d, got
    if bad:
        raise CheckpointError(
            f"no intact checkpoint in {checkpoint_root(out)} (newest: {bad[0][1]}); set "
            "trainer.overwrite_output_dir=true to move this run aside and start over"
        )
    return None


def _incomplete(d: Path) -> Any:
    raise CorruptCheckpoint(f"{d / STATE_FILE} is missing")


def announce(ckpt: Path, step: int, changes: list[Change]) -> None:
    """Say where the run resumes, and every config change and what becomes of it."""
    notice(f"resuming from {ckpt} at step {step}")
    if changes:
        notice("the config differs from the checkpoint's:")
        for c in changes:
            print(f"  {c.describe(step)}", file=sys.stderr, flush=True)
