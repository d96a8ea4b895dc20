"""Small helpers shared by the `dra-driver` subcommands."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping

ENV_PREFIX = "DRA_DRIVER_"


def env_name(option: str) -> str:
    """`--plugin-dir` -> `DRA_DRIVER_PLUGIN_DIR`."""
    return ENV_PREFIX + option.lstrip("-").replace("-", "_").upper()


def apply_env_defaults(parser: argparse.ArgumentParser, environ: Mapping[str, str] | None = None) -> None:
    """Let every long flag of `parser` also be set through `DRA_DRIVER_<FLAG>`.

    The command line still wins; the environment only replaces the built-in default. Values go
    through the action's `type`, so bad env values fail exactly like bad flags. Help texts name
    the variable so that `--help` documents it.
    """
    env = os.environ if environ is None else environ
    for action in parser._actions:  # argparse has no public iterator over actions
        longs = [o for o in action.option_strings if o.startswith("--")]
        if not longs or action.dest in ("help", "version"):
            continue
        name = env_name(longs[0])
        if action.help and action.help is not argparse.SUPPRESS and name not in action.help:
            action.help = f"{action.help} [env {name}]"
        if name not in env:
            continue
        raw = env[name]
        if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
            value: object = raw.strip().lower() in ("1", "true", "yes", "on")
        elif action.type is not None and callable(action.type):
            try:
                value = action.type(raw)
            except (TypeError, ValueError) as exc:
                parser.error(f"environment variable {name}={raw!r} is invalid for {longs[0]}: {exc}")
        else:
            value = raw
        if action.choices is not None and value not in action.choices:
            parser.error(f"environment variable {name}={raw!r}: choose one of {sorted(map(str, action.choices))}")
        action.default = value
        action.required = False
