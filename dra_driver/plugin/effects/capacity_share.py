"""Capacity share: a share of a GPU allocated through consumable capacity (device `gpu-N-shared`, or `gpu-N` with
`--consumable-shares`), served by the GPU's one `gpu-<uuid>` MPS daemon with the share's consumed memory and
compute as its limits (plugin/mps.py; docs/consumable-capacity.md).

The daemon's lifecycle is the one the MPS daemon effect has too (mps_lifecycle.py), over the records that are
shares; what differs is the plan: each share's limits come from its allocation result's consumedCapacity.
"""

from __future__ import annotations

from collections.abc import Sequence

from dra_driver.plugin.checkpoint import MpsRecord
from dra_driver.plugin.effects.base import ClaimPlan, NodeTools
from dra_driver.plugin.effects.mps_lifecycle import MpsLifecycle
from dra_driver.plugin.mps import share_records


class CapacityShare(MpsLifecycle):
    kind = "capacity-share"
    shares = True
    daemon_prefix = "gpu-"

    def __init__(self, tools: NodeTools) -> None:
        super().__init__(tools)
        self.driver_name = tools.driver_name

    def _records(self, claim: ClaimPlan, uuids: Sequence[str | None]) -> tuple[MpsRecord | None, ...]:
        return share_records(claim.devices, claim.configs, claim.results, self.driver_name)
