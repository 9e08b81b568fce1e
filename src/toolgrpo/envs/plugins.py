"""Users' environment modules: ``--import MODULE``, ``trainer.imports`` and installed packages'
``toolgrpo.envs`` entry points, imported so their ``@register_env`` runs before envs are built.

A reference is a module name (``my_pkg.envs``) or a path to a ``.py`` file (its folder goes on
``sys.path`` and it is imported under its stem, so Ray workers and pickles see one module name).
Every process that builds environments calls ``load_plugins`` (the CLI, the trainer, each Ray
rollout worker); a plugin that fails to import is a one-line ``PluginError`` naming it.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterable
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from types import ModuleType
from typing import Any

from toolgrpo.errors import UserError

ENTRY_POINT_GROUP = "toolgrpo.envs"
_entry_points_loaded = False


class PluginError(UserError):
    """An environment plugin that cannot be imported (the message names it and why)."""


def resolve_import(ref: str) -> str:
    """``ref`` as every process can import it: a ``.py`` path made absolute, a name unchanged."""
    if ref.endswith(".py"):
        return str(Path(ref).expanduser().resolve())
    return ref


def import_plugin(ref: str) -> ModuleType:
    """Import a module name or a ``.py`` file (once per process)."""
    name = ref
    if ref.endswith(".py"):
        path = Path(ref).expanduser().resolve()
        if not path.is_file():
            raise PluginError(f"environment plugin {ref!r}: no such file")
        name = path.stem
        loaded = sys.modules.get(name)
        origin = getattr(loaded, "__file__", None)
        if loaded is not None and origin and Path(origin).resolve() != path:
            raise PluginError(
                f"environment plugin {ref!r}: a module named {name!r} is already imported "
                f"from {origin}; rename the file"
            )
        if str(path.parent) not in sys.path:
            sys.path.insert(0, str(path.parent))
    try:
        return importlib.import_module(name)
    except Exception as e:  # a broken plugin: say which, not a traceback
        raise PluginError(f"cannot import environment plugin {ref!r}: {_why(e)}") from e
    except SystemExit as e:  # e.g. argparse at import time, reading toolgrpo's own argv
        raise PluginError(f"environment plugin {ref!r} {_exited(e)}") from None


def load_entry_points() -> list[str]:
    """Import every installed package's ``toolgrpo.envs`` entry point (once per process);
    returns their ``name = value`` lines."""
    global _entry_points_loaded
    if _entry_points_loaded:
        return []
    _entry_points_loaded = True  # a failure is reported once, not on every lookup
    done = []
    for ep in _group():
        dist = f" of {ep.dist.name}" if getattr(ep, "dist", None) is not None else ""
        where = f"(entry point {ep.value!r}{dist}, group {ENTRY_POINT_GROUP})"
        try:
            ep.load()
        except Exception as e:
            raise PluginError(
                f"cannot load environment plugin {ep.name!r} {where}: {_why(e)}"
            ) from e
        except SystemExit as e:
            raise PluginError(f"environment plugin {ep.name!r} {where} {_exited(e)}") from None
        done.append(f"{ep.name} = {ep.value}")
    return done


def load_plugins(imports: Iterable[str] = ()) -> list[str]:
    """Entry points, then ``imports`` in order: what a process does before building envs."""
    done = load_entry_points()
    for ref in imports:
        import_plugin(str(ref))
        done.append(str(ref))
    return done


def load_run_plugins(cfg: Any, extra: Iterable[str] = ()) -> None:
    """A run's plugins: ``extra`` (the CLI's ``--import``) joins ``cfg.trainer.imports``, paths
    made absolute, so the saved config and the Ray workers import the same; then load them."""
    refs = [resolve_import(str(r)) for r in [*cfg.trainer.imports, *extra]]
    cfg.trainer.imports = list(dict.fromkeys(refs))
    load_plugins(cfg.trainer.imports)


def _group() -> list[EntryPoint]:
    return list(entry_points(group=ENTRY_POINT_GROUP))


def _why(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _exited(e: SystemExit) -> str:
    """Why a plugin that called ``sys.exit`` while being imported is refused."""
    return (
        f"called sys.exit({e.code!r}) while being imported (does it parse sys.argv at import? "
        'put that under `if __name__ == "__main__":`)'
    )
