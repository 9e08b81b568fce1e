"""What ``toolgrpo <command> --help`` says about the config, and ``--keys``: every config key
with its default, generated from the schema (so it cannot drift from what the loader accepts)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import textwrap
from typing import Any

CONFIG_ARGS = "[config.yaml] [key=value ...]"
CONFIG_HELP = (
    "a YAML config and/or dotted overrides with verl's key names "
    "(e.g. data.train_batch_size=8 trainer.output_dir=outputs/run); see --keys"
)
_EPILOG = """\
config: a YAML file (examples in configs/) and dotted key=value overrides, applied in order.
sections: {sections}
every key with its default: toolgrpo {command} --keys (defined, with comments, in {where})"""


def _schema(name: str) -> Any:
    if name == "sft":
        from toolgrpo.sft.config import SFTConfig

        return SFTConfig
    from toolgrpo.config.schema import TrainConfig

    return TrainConfig


def epilog(command: str, schema: str = "train") -> str:
    cls = _schema(schema)
    names = ", ".join(f.name for f in dataclasses.fields(cls))
    sections = textwrap.fill(names, 100, subsequent_indent="  ", break_on_hyphens=False)
    return _EPILOG.format(sections=sections, command=command, where=cls.__module__)


def key_lines(schema: Any, prefix: str = "") -> list[str]:
    """``dotted.key = default`` for every leaf of a config dataclass, in schema order."""
    lines: list[str] = []
    for f in dataclasses.fields(schema):
        if f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = f.default
        if dataclasses.is_dataclass(default):
            lines += key_lines(type(default), f"{prefix}{f.name}.")
        else:
            lines.append(f"{prefix}{f.name} = {json.dumps(default, default=str)}")
    return lines


class KeysAction(argparse.Action):
    """``--keys``: print every config key with its default and exit."""

    def __init__(self, option_strings: list[str], dest: str, schema: str = "train", **kw: Any):
        self.schema = schema
        kw.setdefault("help", "list every config key with its default, then exit")
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kw)

    def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
        print("\n".join(key_lines(_schema(self.schema))))
        sys.exit(0)


def add_config_args(
    p: argparse.ArgumentParser, command: str, schema: str = "train", last: str = ""
) -> None:
    """The config positional (shown as ``[config.yaml] [key=value ...]``, then ``last``),
    ``--keys``, and the epilog that says where the keys are described."""
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = epilog(command, schema)
    p.add_argument("--keys", action=KeysAction, schema=schema)
    metavar = f"{CONFIG_ARGS} {last}".strip()
    text = CONFIG_HELP + (f"; {last} comes last" if last else "")
    p.add_argument("rest", nargs=argparse.REMAINDER, metavar=metavar, help=text)


def config_sections() -> set[str]:
    """Top-level sections of the training config: ``data.x=1`` looks like an override."""
    return {f.name for f in dataclasses.fields(_schema("train"))}


def looks_like_override(arg: str) -> bool:
    """``section.key=value`` with a known section (a misspelt key below it counts too)."""
    key, eq, _ = arg.partition("=")
    return bool(eq) and " " not in key and key.split(".", 1)[0] in config_sections()


def hoist_options(p: argparse.ArgumentParser, rest: list[str]) -> tuple[list[str], list[str]]:
    """``p``'s options found among the config arguments (``train cfg.yaml --help``, ``eval
    k=v --limit 2``, ``infer PROMPT --sample``), with their values, and the arguments left
    (after ``--``, nothing is an option). Raises ``ValueError`` naming an argument that looks
    like an option but is none of ``p``'s (an override never starts with ``-``)."""
    moved: list[str] = []
    kept: list[str] = []
    i = 0
    while i < len(rest):
        a = rest[i]
        if a == "--":
            kept.extend(rest[i:])
            break
        if not _looks_like_option(a):
            kept.append(a)
            i += 1
            continue
        name, eq, _ = a.partition("=")
        action = p._option_string_actions.get(name if a.startswith("--") else a)
        if action is None:
            known = ", ".join(s for s in p._option_string_actions if s.startswith("--"))
            raise ValueError(f"unknown option {a!r} (this command's options: {known})")
        takes = 0 if action.nargs == 0 or eq else 1
        moved.extend(rest[i : i + 1 + takes])
        i += 1 + takes
    return moved, kept


def _looks_like_option(arg: str) -> bool:
    """``-x``, ``--name`` or ``--name=value``; not ``-``, ``-5`` or a prompt with spaces."""
    if not arg.startswith("-") or arg == "-" or any(c.isspace() for c in arg.partition("=")[0]):
        return False
    try:
        float(arg)
    except ValueError:
        return True
    return False
