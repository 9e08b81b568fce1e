"""``toolgrpo train | eval | sft | infer | serve-env | label``: YAML plus dotted overrides, as in
verl."""

from __future__ import annotations

import argparse
import errno
import json
import os
import re
import sys

from toolgrpo.cli_errors import USER_ERRORS, sigterm_as_interrupt, stopped, user_cause, user_errors
from toolgrpo.cli_help import CONFIG_ARGS, add_config_args, hoist_options, looks_like_override
from toolgrpo.errors import UserError

__all__ = ["USER_ERRORS", "main", "user_cause", "user_errors"]


class UsageError(UserError):
    """A command line that cannot mean what was asked (printed as one line, exit 2)."""


# Quiet, offline, and friendly to 2-core machines before torch/transformers import.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def _split(args: list[str]) -> tuple[str | None, list[str]]:
    """The config file (the first ``*.yaml`` argument) and the ``key=value`` overrides. A path
    may hold an ``=`` (``runs/B=0.3/config.yaml``): an argument is an override only when what
    precedes its first ``=`` is a dotted key."""
    cfg = None
    overrides = []
    for a in args:
        key = a.split("=", 1)[0] if "=" in a else None
        is_override = key is not None and re.fullmatch(r"[A-Za-z_][\w.]*", key) is not None
        if not is_override and a.endswith((".yaml", ".yml")) and cfg is None:
            cfg = a
        else:
            overrides.append(a)
    return cfg, overrides


def _pop_imports(args: argparse.Namespace) -> list[str]:
    """``--import MODULE`` given after the config (argparse leaves it in ``rest``) joins those
    given before; ``rest`` keeps the other arguments."""
    rest: list[str] = []
    items = iter(args.rest)
    for a in items:
        if a == "--import":
            module = next(items, None)
            if module is None:
                raise UsageError("--import needs a MODULE (a module name or a .py file)")
            args.imports.append(module)
        elif a.startswith("--import="):
            args.imports.append(a.split("=", 1)[1])
        else:
            rest.append(a)
    args.rest = rest
    return args.imports


def cmd_train(args: argparse.Namespace) -> int:
    from toolgrpo.config.loader import load_config
    from toolgrpo.config.schema import TrainConfig
    from toolgrpo.envs.plugins import load_run_plugins
    from toolgrpo.trainer.trainer import Trainer

    imports = _pop_imports(args)
    path, overrides = _split(args.rest)
    cfg = load_config(TrainConfig, path, overrides)
    load_run_plugins(cfg, imports)  # users' env types, here and in Ray workers
    args.output_dir = cfg.trainer.output_dir  # named if interrupted
    trainer = Trainer(cfg)
    try:
        trainer.fit()  # ends with the run's summary (where outputs are, what to open)
    finally:
        trainer.close()
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from toolgrpo.eval.cli import run_eval

    imports = _pop_imports(args)
    path, overrides = _split(args.rest)
    return run_eval(
        path,
        overrides,
        args.checkpoint,
        args.output,
        args.limit,
        args.samples,
        args.rollout_data_dir,
        imports=imports,
        fit_offset=args.fit_offset,
    )


def cmd_sft(args: argparse.Namespace) -> int:
    from toolgrpo.config.loader import load_config
    from toolgrpo.envs.plugins import load_run_plugins
    from toolgrpo.sft.config import SFTConfig
    from toolgrpo.sft.trainer import SFTTrainer

    imports = _pop_imports(args)
    path, overrides = _split(args.rest)
    cfg = load_config(SFTConfig, path, overrides)
    load_run_plugins(cfg, imports)  # --import joins trainer.imports, as in toolgrpo train
    args.output_dir = cfg.trainer.output_dir
    trainer = SFTTrainer(cfg)
    try:
        result = trainer.fit()
    finally:
        trainer.close()
    print(json.dumps(result))
    return 0


def cmd_infer(args: argparse.Namespace) -> int:
    from toolgrpo.infer import run_infer

    imports = _pop_imports(args)
    if not args.rest:
        raise UsageError("toolgrpo infer needs a prompt (the last argument)")
    prompt = args.rest[-1]
    if looks_like_override(prompt):
        raise UsageError(
            f"the last argument, {prompt!r}, looks like a config override, but the prompt comes "
            "last: toolgrpo infer [options] [config.yaml] [key=value ...] PROMPT"
        )
    path, overrides = _split(args.rest[:-1])
    run_infer(
        path,
        overrides,
        prompt,
        args.task_type,
        checkpoint=args.checkpoint,
        ground_truth=args.ground_truth,
        system=args.system,
        sample=args.sample,
        route=args.route,
        imports=imports,
    )
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from toolgrpo.report.html import write_report

    out = write_report(args.run_dir, args.output, args.rollout_data_dir)
    print(f"wrote {out} (open it in a browser; it needs no network)")
    return 0


def cmd_serve_env(args: argparse.Namespace) -> int:
    from toolgrpo.envs.plugins import load_plugins
    from toolgrpo.envs.registry import EnvConfigError
    from toolgrpo.envs.server import TOKEN_ENV, parse_options, read_token, serve

    if args.token is not None:  # kept as an option only to say what to use instead
        print(
            "toolgrpo serve-env: error: --token would show the token to every user of this "
            f"machine (process list); set {TOKEN_ENV} or pass --token-file PATH",
            file=sys.stderr,
        )
        return 2
    try:
        token = read_token(args.token_file)
        load_plugins(args.imports)  # entry points and modules that register custom env types
        serve(
            args.name,
            parse_options(args.option),
            args.host,
            args.port,
            token,
            args.verbose,
            idle_timeout_s=args.idle_timeout,
            max_sessions=args.max_sessions,
            header_timeout_s=args.header_timeout,
            handshake_timeout_s=args.handshake_timeout,
            max_connections=args.max_connections,
            allow_hosts=args.allow_host,
            allow_origins=args.allow_origin,
        )
    except (EnvConfigError, ValueError, ImportError) as e:
        print(f"toolgrpo serve-env: error: {e}", file=sys.stderr)
        return 2
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="toolgrpo", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument("--version", action="version", version=f"toolgrpo {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    text = f"GRPO/PPO training: {CONFIG_ARGS}"
    p = sub.add_parser("train", help=text, description=text)
    add_import_arg(p)
    add_config_args(p, "train")
    p.set_defaults(func=cmd_train)
    text = "score a model or checkpoint on held-out tasks (default: the RLLA test split)"
    p = sub.add_parser("eval", help=text, description=text)
    p.add_argument("--checkpoint", help="a checkpoint dir (global_step_N) or an HF model dir")
    p.add_argument("--output", default=None, help="where to write the JSON result")
    p.add_argument("--limit", type=int, default=-1, help="evaluate only the first N tasks")
    p.add_argument("--samples", type=int, default=5, help="decoded samples kept in the JSON")
    p.add_argument(
        "--rollout-data-dir", default=None, help="write every episode to DIR/0.jsonl (report)"
    )
    p.add_argument(
        "--fit-offset",
        action="store_true",
        help="router checkpoints: first fit the served head's budget offset on the config's "
        "training tasks and save it in router.pt (docs/router.md)",
    )
    add_import_arg(p)
    add_config_args(p, "eval")
    p.set_defaults(func=cmd_eval)
    p = sub.add_parser("report", help="one self-contained HTML page of a run")
    p.add_argument("run_dir", help="a training run's trainer.output_dir")
    p.add_argument("--output", default=None, help="where to write it (default RUN_DIR/report.html)")
    p.add_argument("--rollout-data-dir", default=None, help="dumps elsewhere than the config says")
    p.set_defaults(func=cmd_report)
    text = f"supervised fine-tuning: {CONFIG_ARGS}"
    p = sub.add_parser("sft", help=text, description=text)
    add_import_arg(p)
    add_config_args(p, "sft", schema="sft")
    p.set_defaults(func=cmd_sft)
    text = f"play one episode: [options] {CONFIG_ARGS} PROMPT"
    p = sub.add_parser("infer", help=text, description=text)
    p.add_argument("--task-type", default="calculator", help="which environment plays it")
    p.add_argument("--checkpoint", help="a checkpoint dir (global_step_N) or an HF model dir")
    p.add_argument("--ground-truth", default="", help="the answer, to print the env's reward")
    p.add_argument("--system", default=None, help="an extra system message")
    p.add_argument("--sample", action="store_true", help="sample instead of greedy decoding")
    p.add_argument("--route", default=None, help="force a route: ANSWER, SEARCH or CALCULATE")
    add_import_arg(p)
    add_config_args(p, "infer", last="PROMPT")
    p.set_defaults(func=cmd_infer)
    p = sub.add_parser("serve-env", help="serve an environment over WebSocket")
    p.add_argument("name", help="a registered environment type, e.g. calculator")
    p.add_argument("--host", default="127.0.0.1", help="non-loopback addresses need a token")
    p.add_argument("--port", type=int, default=8900)
    p.add_argument("--token", default=None, help="refused: use $TOOLGRPO_ENV_TOKEN or --token-file")
    p.add_argument("--token-file", default=None, help="file holding the bearer token")
    p.add_argument(
        "--idle-timeout", type=float, default=600.0, help="close sessions idle this many seconds"
    )
    p.add_argument("--max-sessions", type=int, default=1024, help="open sessions at most")
    p.add_argument(
        "--max-connections",
        type=int,
        default=None,
        help="open sockets at most (default: --max-sessions + 64)",
    )
    p.add_argument(
        "--header-timeout", type=float, default=10.0, help="seconds to send request headers"
    )
    p.add_argument(
        "--handshake-timeout", type=float, default=30.0, help="seconds from upgrade to reset"
    )
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="env option")
    p.add_argument(
        "--allow-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="a web page origin (scheme://host[:port]) that may connect; none by default",
    )
    p.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="another name clients may call this server by (Host header); repeatable",
    )
    add_import_arg(p, config=False)
    p.set_defaults(func=cmd_serve_env)
    from toolgrpo.router.label_cli import add_parser as add_label_parser

    add_label_parser(sub)
    return parser


def add_import_arg(p: argparse.ArgumentParser, config: bool = True) -> None:
    """``--import MODULE`` (repeatable): a module name or a .py file registering env types."""
    text = (
        "import MODULE (a module name or a .py file) first, to register custom environment "
        "types; repeatable" + ("; adds to trainer.imports" if config else "")
    )
    p.add_argument(
        "--import", dest="imports", action="append", default=[], metavar="MODULE", help=text
    )


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("toolgrpo")
    except Exception:  # run from a source tree that is not installed
        from toolgrpo import __version__

        return __version__


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    from toolgrpo.run_log import setup_console

    restore_logging = setup_console(args.verbose)  # libraries' logs: run.log, not the console
    from toolgrpo.errors import one_line

    try:
        with sigterm_as_interrupt():  # a scheduler's preemption stops a run as Ctrl-C does
            return args.func(args)
    except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM: where the run stands, not a traceback
        line, code = stopped(args.command, e, getattr(args, "output_dir", None))
        print(line, file=sys.stderr)
        return code
    except Exception as e:
        cause = user_cause(e)
        if cause is None:
            raise  # a bug: keep the traceback
        text = one_line(cause)
        if isinstance(cause, OSError) and cause.errno in (errno.ENOSPC, errno.EDQUOT):
            where = f": {cause.filename}" if cause.filename else ""
            text = f"disk full: {cause.strerror}{where}"
        print(f"toolgrpo {args.command}: error: {text}", file=sys.stderr)
        return 2
    finally:
        restore_logging()  # for callers in a process that goes on (tests)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    """The command line; options given after the config and overrides (``train cfg.yaml
    --help``, ``eval k=v --limit 2``) count as if given before them."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    args = parser.parse_args(argv)
    rest = getattr(args, "rest", None)
    if not rest:
        return args
    try:
        moved, kept = hoist_options(_subparser(parser, args.command), rest)
    except ValueError as e:  # an option this command does not have
        parser.exit(2, f"toolgrpo {args.command}: error: {e}\n")
    if not moved:
        return args
    head = argv[: len(argv) - len(rest)]
    return parser.parse_args([*head, *moved, *kept])


def _subparser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[command]
    raise KeyError(command)


if __name__ == "__main__":
    sys.exit(main())
