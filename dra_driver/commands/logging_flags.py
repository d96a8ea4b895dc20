"""`--log-level` and `--log-format` of the long-running commands (kubelet-plugin, compute-domain-kubelet-plugin,
compute-domain-daemon, controller): one definition, and the one call that applies them."""

from __future__ import annotations

import argparse
from typing import Final

from dra_driver.commands.flags import Flag
from dra_driver.observability.logging import LEVELS, configure_logging

LOG_FLAGS: Final = (
    Flag("--log-level", choices=LEVELS, default="info", help="log level"),
    Flag("--log-format", choices=("json", "text"), default="json", help="json lines, or key=value text"),
)


def configure_logging_from_args(args: argparse.Namespace) -> None:
    configure_logging(args.log_level, args.log_format)
