"""``serve-env``'s startup input: env options from ``--option``, the token, and their checks.

Everything here runs before the server binds a port, so bad input is one line and exit 2.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from toolgrpo.data.task import Task
from toolgrpo.envs.registry import EnvConfigError, get_env_factory

TOKEN_ENV = "TOOLGRPO_ENV_TOKEN"


def check_options(env_type: str, options: Mapping[str, Any]) -> None:
    """Raise ``EnvConfigError`` at startup for options the env type refuses. Probed by building one
    env on an empty task; an env that cannot be built without a real task is checked at reset."""
    factory = get_env_factory(env_type)
    probe = Task("options-check", ({"role": "user", "content": ""},), "")
    try:
        env = factory(probe, dict(options))
    except EnvConfigError:
        raise
    except Exception:  # needs a real task (e.g. BFCL): its options are checked per episode
        return
    close = getattr(env, "close", None)
    if close is not None:
        try:
            asyncio.run(close())
        except Exception:
            pass


def parse_options(pairs: list[str]) -> dict[str, Any]:
    """``key=value`` strings as env options; values read as YAML scalars (``3`` is an int)."""
    import yaml

    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not key or not key.replace("_", "a").replace("-", "a").isalnum():
            raise ValueError(f"--option expects KEY=VALUE with a plain key, got {pair!r}")
        if key in out:
            raise ValueError(f"--option {key} given twice")
        try:
            out[key] = yaml.safe_load(value) if value else ""
        except yaml.YAMLError:
            out[key] = value
    return out


def read_token(token_file: str | None = None) -> str | None:
    """The server's token from ``--token-file`` or ``$TOOLGRPO_ENV_TOKEN`` (never the command
    line, where every user of the machine can read it in the process list)."""
    if token_file:
        p = Path(token_file)
        try:
            text = p.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"cannot read --token-file {p}: {e}") from e
        if not text:
            raise ValueError(f"--token-file {p} is empty")
        return text
    return os.environ.get(TOKEN_ENV) or None
