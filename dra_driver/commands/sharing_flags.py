"""The sharing flags, shared by `kubelet-plugin` and `inventory`: one definition, one error path."""

from __future__ import annotations

import argparse
from typing import Final

from dra_driver.commands.flags import Flag
from dra_driver.inventory.sharing import (
    COMPUTE_DEFAULT_HELP,
    CONSUMABLE_SHARES_HELP,
    DEFAULT_COMPUTE_DEFAULT,
    DEFAULT_MEMORY_DEFAULT,
    DEFAULT_MEMORY_STEP,
    MEMORY_DEFAULT_HELP,
    MEMORY_STEP_HELP,
    SHARED_GPUS_HELP,
    SHARING_MODE_HELP,
    ConsumableMode,
    SharingMode,
    SharingSettings,
    sharing_settings,
)

SHARING_FLAGS: Final = (
    Flag("--sharing-mode", choices=[m.value for m in SharingMode], default=SharingMode.EXCLUSIVE.value,
         help=SHARING_MODE_HELP),
    Flag("--shared-gpus", default="", help=SHARED_GPUS_HELP),
    Flag("--share-memory-step", default=DEFAULT_MEMORY_STEP, help=MEMORY_STEP_HELP),
    Flag("--share-memory-default", default=DEFAULT_MEMORY_DEFAULT, help=MEMORY_DEFAULT_HELP),
    Flag("--share-compute-default", default=str(DEFAULT_COMPUTE_DEFAULT), help=COMPUTE_DEFAULT_HELP),
    Flag("--consumable-shares", default=ConsumableMode.DISABLED.value, help=CONSUMABLE_SHARES_HELP),
)


def sharing_from_args(args: argparse.Namespace) -> SharingSettings:
    """Raises SharingSettingsError (a ValueError) naming the flag and the fix."""
    return sharing_settings(
        args.sharing_mode,
        shared_gpus=args.shared_gpus,
        memory_step=args.share_memory_step,
        memory_default=args.share_memory_default,
        compute_default=args.share_compute_default,
        consumable=args.consumable_shares,
    )
