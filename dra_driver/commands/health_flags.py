"""The kubelet plugin's device-health flags: the NVML event monitor and how long its device taints last
(docs/kubelet-plugin.md "Device health", docs/operations.md "Healing")."""

from __future__ import annotations

import argparse
from typing import Final

from dra_driver import defaults
from dra_driver.commands.flags import Flag

HEALTH_FLAGS: Final = (
    Flag("--health-monitor", choices=("on", "off"), default="on",
         help="watch NVML Xid/ECC events and taint bad devices"),
    Flag("--ignore-xids", default="",
         help="Xids to treat as application errors, besides 13,31,43,45,68,109 (e.g. 48,63)"),
    Flag("--health-heal-after", type=float, default=defaults.HEALTH_HEAL_AFTER_S,
         help="seconds without a new event (and, for an unhealthy device, a passing NVML probe) after which a device "
              "problem's taint is removed; GPU lost and Xid 79 never heal; 0: problems last until a restart"),
    Flag("--health-heal-after-max", type=float, default=defaults.HEALTH_HEAL_AFTER_MAX_S,
         help="cap of the healthy window, which doubles for each repeated problem (flapping)"),
    Flag("--health-check-interval", type=float, default=defaults.HEALTH_CHECK_INTERVAL_S,
         help="seconds between checks of healing (devices whose healthy window passed); sends no API request"),
)


def ignored_xids_from_args(args: argparse.Namespace) -> frozenset[int]:
    """The Xids the monitor treats as application errors: the default ones and `--ignore-xids`'s. Raises ValueError
    naming the flag."""
    from dra_driver.plugin.health.problems import DEFAULT_IGNORED_XIDS, parse_xid_list

    return DEFAULT_IGNORED_XIDS | parse_xid_list(args.ignore_xids)
