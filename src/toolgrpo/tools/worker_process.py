"""The processes behind isolated tools: a zygote that forks workers, and the workers' loop.

The zygote is a fresh interpreter (started once per process that uses isolated tools) that
imports the tools' modules and then forks a worker per request: a worker starts in a few
milliseconds, is never a fork of the trainer (whose torch threads make fork unsafe), and unlike
multiprocessing's spawn and fork server never re-imports the user's ``__main__`` script (which,
without a main guard, would start a second training run in every worker).
"""

from __future__ import annotations

import importlib
import inspect
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import Any

_CPU_GRACE_S = 5  # a worker's own CPU limit (RLIMIT_CPU) trails the call's deadline by this
WARM_UP_HOOK = "warm_up_isolated"  # a tool module's function the zygote runs once after import


def reference(fn: Callable[..., Any]) -> tuple[Any, ...]:
    """A module-level function by name (so ``@tool`` replacing it with a ``Tool`` still works),
    anything else (a partial, a callable object) pickled."""
    qualname = getattr(fn, "__qualname__", "")
    if inspect.isfunction(fn) and "<" not in qualname:
        if fn.__module__ == "__main__":
            raise ValueError(f"{qualname} is defined in __main__; workers import tools by module")
        return ("name", fn.__module__, qualname)
    if inspect.isfunction(fn):
        raise ValueError(f"{qualname} is not importable (a lambda or a nested function)")
    return ("pickle", pickle.dumps(fn))


def resolve(ref: tuple[Any, ...]) -> Callable[..., Any]:
    if ref[0] == "pickle":
        return pickle.loads(ref[1])
    obj: Any = importlib.import_module(ref[1])
    for part in ref[2].split("."):
        obj = getattr(obj, part)
    return obj if inspect.isfunction(obj) else getattr(obj, "fn", obj)  # a Tool: its function


# ---------------------------------------------------------------- a worker


def worker_main(conn: Connection, preload: Sequence[str]) -> None:
    """Import ``preload``, say ready, then run calls until the parent closes the pipe."""
    import resource

    try:
        for module in preload:
            importlib.import_module(module)
    except BaseException as exc:
        conn.send(("failed", f"cannot import {module}: {type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", os.getpid()))
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            return  # the parent is gone
        if request[0] == "import":  # before a call's deadline starts: imports can take seconds
            try:
                importlib.import_module(request[1])
                conn.send(("imported", request[1]))
            except BaseException as exc:
                conn.send(("failed", f"cannot import {request[1]}: {type(exc).__name__}: {exc}"))
            continue
        _, ref, kwargs, timeout_s, memory_limit_mb = request
        _set_limits(resource, timeout_s, memory_limit_mb)
        try:
            reply: tuple[Any, ...] = ("ok", resolve(ref)(**kwargs))
        except MemoryError:
            reply = ("memory", memory_limit_mb)
        except BaseException as exc:
            reply = ("raised", _portable(exc))
        finally:
            _set_limits(resource, None, None)
        try:
            conn.send(reply)
        except Exception as exc:  # an unpicklable result
            conn.send(("raised", TypeError(f"the tool's result cannot be sent back: {exc}")))
        if reply[0] == "memory":
            return  # an interpreter that hit its memory limit is not trusted with more calls


def _set_limits(resource: Any, timeout_s: float | None, memory_limit_mb: float | None) -> None:
    """Per call: an address-space cap above what the worker already uses, and a CPU limit that
    ends the worker by itself if its parent died and nobody is left to kill it."""
    inf = resource.RLIM_INFINITY
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = hard
    if memory_limit_mb and memory_limit_mb > 0:
        soft = _address_space_bytes() + int(memory_limit_mb * 2**20)
        soft = soft if hard == inf else min(soft, hard)
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    soft = hard
    if timeout_s and timeout_s > 0:
        used = resource.getrusage(resource.RUSAGE_SELF)
        soft = int(used.ru_utime + used.ru_stime + timeout_s) + _CPU_GRACE_S
        soft = soft if hard == inf else min(soft, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def _address_space_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0  # no /proc: the limit is then absolute


def _portable(exc: BaseException) -> BaseException:
    """The exception itself if it survives pickling, else a RuntimeError with its text."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")


# ---------------------------------------------------------------- the zygote


def zygote_main() -> None:
    """``python -c ... <control fd> <module>...``: import the modules, then fork one worker per
    byte received, answering with its pid and one end of its socket pair."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    control = socket.socket(fileno=int(sys.argv[1]))
    preload = sys.argv[2:]
    for module in preload:
        try:
            warm_up = getattr(importlib.import_module(module), WARM_UP_HOOK, None)
            if callable(warm_up):
                warm_up()  # once here, inherited by every fork (sympy's first solve: ~0.2 s)
        except BaseException:  # the worker reports a failed import to the parent itself
            traceback.print_exc()
    while True:
        try:
            request = control.recv(1)
        except OSError:
            request = b""
        if not request:
            os._exit(0)  # the parent is gone
        _reap()
        ours, theirs = socket.socketpair()
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                control.close()
                ours.close()
                worker_main(Connection(theirs.detach()), preload)
            except BaseException:
                code = 1
            finally:
                os._exit(code)
        theirs.close()
        socket.send_fds(control, [pid.to_bytes(4, "little")], [ours.fileno()])
        ours.close()


def _reap() -> None:
    """Children are reaped only here, before the next fork: the parent opened a pidfd on each
    as soon as it was forked, so a pid is never reused while the parent may still signal it."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)  # Linux >= 5.3
    except (AttributeError, OSError):  # elsewhere, or refused by a sandbox: plain kill(pid)
        return None


class Zygote:
    """The parent's handle on its zygote (started lazily, restarted if it died)."""

    def __init__(self, preload: Sequence[str]) -> None:
        self.preload = tuple(preload)
        self.loaded: tuple[str, ...] = ()  # what the running zygote (and its workers) imported
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._sock: socket.socket | None = None

    def fork(self) -> tuple[int, int | None, Connection]:
        """A new worker: its pid, a pidfd (Linux) to signal it safely, and its pipe."""
        with self._lock:
            for attempt in (0, 1):
                if self._sock is None:
                    self._start()
                assert self._sock is not None
                try:
                    self._sock.sendall(b"F")
                    msg, fds, _, _ = socket.recv_fds(self._sock, 4, 1)
                    if len(msg) != 4 or len(fds) != 1:
                        raise EOFError("the tool zygote exited")
                except (OSError, EOFError):
                    self._stop()
                    if attempt:
                        raise
                    continue
                pid = int.from_bytes(msg, "little")
                return pid, _pidfd(pid), Connection(fds[0])
        raise AssertionError("unreachable")

    @property
    def started(self) -> bool:
        return self._sock is not None

    def start(self) -> None:
        """Start the zygote now (it imports the tools while the caller does other work)."""
        with self._lock:
            if self._sock is None:
                self._start()

    def close(self) -> None:
        with self._lock:
            self._stop()

    def _start(self) -> None:
        ours, theirs = socket.socketpair()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)  # this process's imports
        code = "from toolgrpo.tools.worker_process import zygote_main; zygote_main()"
        self.loaded = self.preload
        args = [sys.executable, "-c", code, str(theirs.fileno()), *self.loaded]
        try:
            self._proc = subprocess.Popen(
                args, pass_fds=[theirs.fileno()], env=env, stdin=subprocess.DEVNULL
            )
        finally:
            theirs.close()
        self._sock = ours

    def _stop(self) -> None:
        if self._sock is not None:
            self._sock.close()  # the zygote exits when it reads EOF
            self._sock = None
        if self._proc is not None:
            try:
                self._proc.wait(2.0)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None
