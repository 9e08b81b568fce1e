"""YAML + dotted command-line overrides onto a typed config, with friendly errors for typos."""

from __future__ import annotations

import dataclasses
import difflib
import logging
from pathlib import Path
from typing import Any, TypeVar

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from toolgrpo.errors import UserError

T = TypeVar("T")
log = logging.getLogger(__name__)


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


def _alias_of(key: str, aliases: dict[str, Any]) -> tuple[str, Any] | None:
    """The alias entry ``key`` falls under (exact, or below a section alias ending in ".")."""
    if key in aliases:
        return key, aliases[key]
    for old, new in aliases.items():
        if old.endswith(".") and (key.startswith(old) or key == old[:-1]):
            return old, new
    return None


def rename_key(key: str, value: Any, aliases: dict[str, Any], where: str) -> list[tuple[str, Any]]:
    """``key=value`` in today's spelling, with a warning when ``key`` is an old alias."""
    hit = _alias_of(key, aliases)
    if hit is None:
        return [(key, value)]
    old, new = hit
    if isinstance(new, dict):  # the old key's values stand for settings of other keys
        plain = str(value).strip().strip("'\"")
        if plain not in new:
            raise ConfigError(f"{key}={value!r} ({where}) is not one of {', '.join(new)}")
        settings = new[plain]
        said = " ".join(
            f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in settings.items()
        )
        log.warning("%s=%s (%s) is an old alias: it means %s; use that", key, plain, where, said)
        return list(settings.items())
    renamed = new + key[len(old) :] if old.endswith(".") else new
    if key == old[:-1]:
        renamed = new[:-1]
    log.warning("%s (%s) is an old alias of %s; use that", key, where, renamed)
    return [(renamed, value)]


def _leaves(d: dict, prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.extend(_leaves(v, f"{prefix}{k}."))
        else:
            out.append((f"{prefix}{k}", v))
    return out


def apply_aliases(tree: dict, aliases: dict[str, Any], where: str) -> dict:
    """A YAML tree with old key spellings rewritten (unchanged when none occurs)."""
    leaves = _leaves(tree)
    if not any(_alias_of(k, aliases) for k, _ in leaves):
        return tree
    out: dict = {}
    for key, value in leaves:
        for new_key, new_value in rename_key(key, value, aliases, where):
            *parents, last = new_key.split(".")
            node = out
            for part in parents:
                node = node.setdefault(part, {})
                if not isinstance(node, dict):
                    raise ConfigError(
                        f"{where}: {new_key!r} is set twice, as a value and a section"
                    )
            node[last] = new_value
    return out


def load_config(schema: type[T], path: str | Path | None = None, overrides: list[str] = ()) -> T:
    """Build ``schema`` from its defaults, then a YAML file, then ``key=value`` overrides."""
    allowed = valid_keys(schema)
    free = _free_prefixes(schema)
    aliases: dict[str, Any] = getattr(schema, "key_aliases", {})
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
        tree = OmegaConf.to_container(loaded)
        if aliases:
            renamed = apply_aliases(tree, aliases, str(p))  # type: ignore[arg-type]
            if renamed is not tree:
                loaded = OmegaConf.create(renamed)
                tree = renamed
        _check_keys(_flatten(tree), allowed, str(p), free)
        layers.append(loaded)
    dotlist = []
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key=value")
        key, value = item.lstrip("+").split("=", 1)
        for new_key, new_value in rename_key(key, value, aliases, "command line"):
            _check_keys([new_key], allowed, "command-line overrides", free)
            if not isinstance(new_value, str):
                new_value = str(new_value).lower() if isinstance(new_value, bool) else new_value
            dotlist.append(f"{new_key}={new_value}")
    if dotlist:
        try:
            layers.append(OmegaConf.from_dotlist(dotlist))
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
