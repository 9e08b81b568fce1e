"""YAML + dotted command-line overrides onto a typed config, with friendly errors for typos."""

from __future__ import annotations

import dataclasses
import difflib
from pathlib import Path
from typing import Any, TypeVar

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from toolgrpo.errors import UserError

T = TypeVar("T")


class ConfigError(UserError):
    """A config file or override that cannot be applied; the message says what to change."""


def valid_keys(schema: type) -> set[str]:
    """Every dotted key a schema accepts, nested dataclasses included (``a.b.c``)."""
    keys: set[str] = set()

    def walk(cls: type, prefix: str) -> None:
        hints = {f.name: f for f in dataclasses.fields(cls)}
        for name, f in hints.items():
            dotted = f"{prefix}{name}"
            keys.add(dotted)
            sub = _dataclass_type(f)
            if sub is not None:
                walk(sub, dotted + ".")

    walk(schema, "")
    return keys


def _dataclass_type(f: dataclasses.Field) -> type | None:
    default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
    return type(default) if dataclasses.is_dataclass(default) else None


def _flatten(d: Any, prefix: str = "") -> list[str]:
    if not isinstance(d, dict) or not d:
        return [prefix.rstrip(".")] if prefix else []
    out: list[str] = []
    for k, v in d.items():
        out.extend(_flatten(v, f"{prefix}{k}."))
    return out


def _free_prefixes(schema: type, prefix: str = "") -> list[str]:
    """Dotted names of ``dict`` fields: any key below them is the user's own (e.g. env names)."""
    out: list[str] = []
    for f in dataclasses.fields(schema):
        sub = _dataclass_type(f)
        if sub is not None:
            out.extend(_free_prefixes(sub, f"{prefix}{f.name}."))
        elif f.default_factory is dict:
            out.append(f"{prefix}{f.name}.")
    return out


def _check_keys(keys: list[str], allowed: set[str], where: str, free: list[str] = ()) -> None:
    for key in keys:
        if key in allowed or any(key.startswith(p) for p in free):
            continue
        # A key may name a whole sub-tree (e.g. data=...) or be a leaf below one.
        close = difflib.get_close_matches(key, sorted(allowed), n=3, cutoff=0.6)
        hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        raise ConfigError(f"unknown key {key!r} in {where}{hint}")


def load_config(schema: type[T], path: str | Path | None = None, overrides: list[str] = ()) -> T:
    """Build ``schema`` from its defaults, then a YAML file, then ``key=value`` overrides."""
    allowed = valid_keys(schema)
    free = _free_prefixes(schema)
    base = OmegaConf.structured(schema)
    layers = []
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file not found: {p}")
        try:
            loaded = OmegaConf.load(p)
            if loaded is None or (hasattr(loaded, "keys") and not loaded.keys()):
                loaded = OmegaConf.create({})
        except Exception as e:  # yaml errors come in several types
            raise ConfigError(f"cannot parse {p}: {e}") from e
        if not OmegaConf.is_dict(loaded):
            kind = "a list" if OmegaConf.is_list(loaded) else type(loaded).__name__
            raise ConfigError(
                f"{p}: the top level must be a mapping of sections (data:, trainer:, ...), "
                f"not {kind}"
            )
        _check_keys(_flatten(OmegaConf.to_container(loaded)), allowed, str(p), free)
        layers.append(loaded)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key=value")
        key = item.split("=", 1)[0].lstrip("+")
        _check_keys([key], allowed, "command-line overrides", free)
    if overrides:
        try:
            layers.append(OmegaConf.from_dotlist([o.lstrip("+") for o in overrides]))
        except OmegaConfBaseException as e:
            raise ConfigError(f"bad override: {e}") from e
    try:
        merged = OmegaConf.merge(base, *layers)
        return OmegaConf.to_object(merged)  # type: ignore[return-value]
    except OmegaConfBaseException as e:
        msg = str(e).splitlines()[0]
        key = getattr(e, "full_key", None)
        raise ConfigError(f"invalid value for {key!r}: {msg}" if key else msg) from e


# Keys whose string values are secrets (e.g. a remote environment's ``token``): written to
# config.yaml and checkpoints as REDACTED. ``token_env``/``token_file`` name where a secret is.
SECRET_KEYS = frozenset({"token", "api_key", "password", "secret"})
REDACTED = "<redacted>"


def redact_secrets(value: Any) -> Any:
    """A copy of nested dicts/lists with every secret-named string replaced by ``REDACTED``."""
    if isinstance(value, dict):
        return {
            k: REDACTED
            if str(k).lower() in SECRET_KEYS and isinstance(v, str) and v
            else redact_secrets(v)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return type(value)(redact_secrets(v) for v in value)
    return value


def to_yaml(cfg: Any) -> str:
    """The resolved config as YAML, saved next to every run for reproducibility (secrets
    redacted: a run directory gets copied and shared)."""
    plain = OmegaConf.to_container(OmegaConf.structured(cfg), enum_to_str=True)
    return OmegaConf.to_yaml(OmegaConf.create(redact_secrets(plain)))
