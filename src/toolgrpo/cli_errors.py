"""How ``toolgrpo`` ends when it does not finish: errors the user can fix as one line (exit 2),
Ctrl-C and SIGTERM as one line naming the checkpoint to resume from (exit 130 and 143)."""

from __future__ import annotations

import errno
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from toolgrpo.errors import UserError


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler preempting the job), raised in the main thread as Ctrl-C is, so a
    run stops the same way (a checkpoint being written is removed, not left torn)."""


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM raises ``Terminated`` while inside; a second one kills at once (the default).
    Left alone off the main thread, or where someone else already handles SIGTERM."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    def on_term(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        raise Terminated()

    signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def stopped(command: str, e: KeyboardInterrupt, output_dir: str | None) -> tuple[str, int]:
    """The line and exit code of a run stopped by Ctrl-C (130) or SIGTERM (143)."""
    terminated = isinstance(e, Terminated)
    what, code = ("terminated (SIGTERM)", 143) if terminated else ("interrupted", 130)
    return f"toolgrpo {command}: {what}{resume_hint(output_dir)}", code


def resume_hint(out: str | None) -> str:
    """For train and sft: the checkpoint the same command resumes from."""
    if not out:
        return ""
    from toolgrpo.trainer.checkpoint import latest_checkpoint

    try:
        ckpt = latest_checkpoint(out)
    except OSError:
        ckpt = None
    if ckpt is None:
        return f"; no checkpoint in {out} yet: the same command starts the run over"
    return f"; run the same command again to resume from {ckpt} (trainer.resume=auto)"


# Errors a user can fix, besides toolgrpo.errors.UserError (ConfigError, DataError,
# ModelLoadError...): (module, class). Looked up only in modules already imported, since an
# error of a module never imported cannot have been raised.
USER_ERRORS = (
    ("toolgrpo.models.registry", "ModelNotFound"),
    ("toolgrpo.envs.registry", "EnvConfigError"),
    ("toolgrpo.router.routes", "UnknownRoute"),
    ("toolgrpo.router.families", "FamilyFileError"),
    ("toolgrpo.trainer.episodes", "NonFiniteReward"),  # reward.nan_policy=error
    ("toolgrpo.rollout.prompts", "PromptTooLong"),  # data.truncation=error
    ("toolgrpo.rollout.episode", "EnvFailureError"),  # multi_turn.max_env_failure_ratio passed
    ("toolgrpo.models.safe_load", "CheckpointError"),  # an unsafe or corrupt checkpoint
)


def user_errors() -> tuple[type[BaseException], ...]:
    """The exception classes ``main`` prints as one line with exit code 2."""
    found: list[type[BaseException]] = [UserError, FileNotFoundError]
    for module, name in USER_ERRORS:
        loaded = sys.modules.get(module)
        if loaded is not None and hasattr(loaded, name):
            found.append(getattr(loaded, name))
    return tuple(found)


def user_cause(e: BaseException) -> BaseException | None:
    """``e`` or the first error it was raised from that the user can fix (a rollout thread's
    NonFiniteReward arrives wrapped in the trainer's RuntimeError), else None."""
    kinds = user_errors()
    seen: BaseException | None = e
    while seen is not None:
        if isinstance(seen, kinds):
            return seen
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return seen  # a full disk: the user's to fix, said in one line
        seen = seen.__cause__
    return None
