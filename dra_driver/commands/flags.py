"""Flags that also read `DRA_DRIVER_<FLAG>` from the environment, with argparse's public API only.

This is the only place a command reads its configuration from the environment. A flag may also name a
`fallback_env`: a variable another component sets (the downward API's `POD_NAMESPACE`, `POD_NAME`, `NODE_NAME`,
`POD_IP`; the daemon claim's `CLIQUE_ID`, ...), read when `DRA_DRIVER_<FLAG>` is not set or empty. Precedence:
the command line, then `DRA_DRIVER_<FLAG>`, then the fallback variable, then the built-in default.

A command declares its flags as a table of `Flag`s, which `add_flags` adds to its parser."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

ENV_PREFIX = "DRA_DRIVER_"


def env_name(option: str) -> str:
    """`--plugin-dir` -> `DRA_DRIVER_PLUGIN_DIR`."""
    return ENV_PREFIX + option.lstrip("-").replace("-", "_").upper()


class FlagParser(argparse.ArgumentParser):
    """An ArgumentParser that remembers the actions `add_argument` returned, so that environment
    defaults can be applied without reaching into argparse's private attributes. Subparsers made
    through `add_subparsers` are of the same class (argparse's default `parser_class`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.flag_actions: list[argparse.Action] = []
        self.fallback_envs: dict[str, str] = {}  # action dest -> the variable read when DRA_DRIVER_<FLAG> is not
        super().__init__(*args, **kwargs)

    def add_argument(self, *args: Any, fallback_env: str | None = None, **kwargs: Any) -> argparse.Action:
        action = super().add_argument(*args, **kwargs)
        self.flag_actions.append(action)
        if fallback_env:
            self.fallback_envs[action.dest] = fallback_env
        return action


@dataclass(frozen=True)
class Flag:
    """One flag of a command, as argparse's `add_argument` takes it. `name` is `--long` (or a positional's name),
    `short` an optional `-x`; `switch`: a store_true flag, which takes no value and no default; `negates`: a switch
    that turns the switch it names off (`--no-watch-list` negates `--watch-list`); `repeatable`: each use adds a
    value to a list (empty by default)."""

    name: str
    help: str
    default: object = None
    type: Callable[[str], object] | None = None
    choices: Sequence[str] | None = None
    switch: bool = False
    required: bool = False
    short: str = ""
    fallback_env: str | None = None
    negates: str = ""
    repeatable: bool = False


def add_flags(parser: FlagParser, flags: Iterable[Flag]) -> None:
    """Add each flag of the table `flags`, in order (the order of `--help`), then let the environment set them
    (`apply_env_defaults`): `flags` is the command's whole table."""
    for flag in flags:
        options: dict[str, Any] = {"help": flag.help, "fallback_env": flag.fallback_env}
        if flag.negates:
            options.update(action="store_false", dest=flag.negates.lstrip("-").replace("-", "_"), default=False)
        elif flag.switch:
            options["action"] = "store_true"
        elif flag.repeatable:
            options.update(action=_Repeated, default=[], type=flag.type, choices=flag.choices)
        else:
            options.update(default=flag.default, type=flag.type, choices=flag.choices)
        if flag.required:  # argparse refuses the keyword on a positional, even False
            options["required"] = True
        parser.add_argument(*filter(None, (flag.short, flag.name)), **options)
    apply_env_defaults(parser)


class _Repeated(argparse.Action):
    """A repeatable flag's values, in order. Unlike argparse's "append", the command line replaces the default (the
    environment's list) rather than adding to it: the command line wins."""

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option: str | None = None
    ) -> None:
        held = getattr(namespace, self.dest, None)
        setattr(namespace, self.dest, [*(held if held is not None and held is not self.default else ()), values])


def _is_switch(action: argparse.Action) -> bool:
    """store_true/store_false: no value on the command line, a boolean constant."""
    return action.nargs == 0 and isinstance(action.const, bool)


def apply_env_defaults(parser: FlagParser, environ: Mapping[str, str] | None = None) -> None:
    """Let every long flag of `parser` also be set through `DRA_DRIVER_<FLAG>`.

    The command line still wins; the environment only replaces the built-in default. Values go
    through the action's `type`, so bad env values fail exactly like bad flags. Help texts name
    the variable so that `--help` documents it.
    """
    env = os.environ if environ is None else environ
    for action in parser.flag_actions:
        longs = [o for o in action.option_strings if o.startswith("--")]
        if not longs or action.dest in ("help", "version"):
            continue
        name = env_name(longs[0])
        fallback = parser.fallback_envs.get(action.dest)
        if action.help and action.help is not argparse.SUPPRESS and name not in action.help:
            action.help = f"{action.help} [env {name}" + (f", else {fallback}" if fallback else "") + "]"
        if fallback and not env.get(name) and env.get(fallback):
            name = fallback
        if name not in env:
            continue
        raw = env[name]
        if _is_switch(action):
            value: object = raw.strip().lower() in ("1", "true", "yes", "on")
        elif isinstance(action.default, list):  # a repeatable flag: the variable lists its values, comma-separated
            value = [_env_value(parser, action, name, longs[0], v.strip()) for v in raw.split(",") if v.strip()]
        else:
            value = _env_value(parser, action, name, longs[0], raw)
        action.default = value
        action.required = False


def _env_value(parser: FlagParser, action: argparse.Action, name: str, flag: str, raw: str) -> object:
    """One value from the environment, through the flag's type and choices: a bad one fails as a bad flag does."""
    value: object = raw
    if action.type is not None and callable(action.type):
        try:
            value = action.type(raw)
        except (TypeError, ValueError) as exc:
            parser.error(f"environment variable {name}={raw!r} is invalid for {flag}: {exc}")
    if action.choices is not None and value not in action.choices:
        parser.error(f"environment variable {name}={raw!r}: choose one of {sorted(map(str, action.choices))}")
    return value
