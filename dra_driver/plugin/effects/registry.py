"""The effect kinds, in the order the engine applies them (and undoes them in reverse).

Adding a kind (VFIO passthrough, IMEX channels) is a module beside these with an `Effect` subclass and its
place in `DEVICE_EFFECTS`; the engine, repair and recovery iterate over whatever is here.

Order matters where one kind stands on another: a MIG partition exists before an MPS daemon serves it, and the
daemon is stopped before the partition is destroyed. The CDI spec comes after every device effect: it names
what they made.
"""

from __future__ import annotations

from dra_driver.kubeletplugin.effect import ClaimEffects as ClaimEffectsOf
from dra_driver.plugin.checkpoint import PreparedDevice
from dra_driver.plugin.effects.base import Catalog, ClaimPlan, GpuEffect, NodeTools
from dra_driver.plugin.effects.capacity_share import CapacityShare
from dra_driver.plugin.effects.cdi_spec import CdiSpec
from dra_driver.plugin.effects.mig_partition import MigPartition
from dra_driver.plugin.effects.mps_daemon import MpsDaemon
from dra_driver.plugin.effects.time_slice import TimeSlice
from dra_driver.plugin.effects.vfio_passthrough import VfioPassthrough

# VFIO passthrough stands on no other kind (its claims hold nothing else) and goes first: its refusals (IOMMU,
# a GPU in use) come before anything else is planned or made.
DEVICE_EFFECTS: tuple[type[GpuEffect], ...] = (VfioPassthrough, MigPartition, TimeSlice, MpsDaemon, CapacityShare)


# Every effect kind of this node: the device effects in order, then the claim's CDI spec (the layer's container,
# with this driver's types).
ClaimEffects = ClaimEffectsOf[ClaimPlan, PreparedDevice, None, Catalog]


def node_effects(tools: NodeTools, kinds: tuple[type[GpuEffect], ...] = DEVICE_EFFECTS) -> ClaimEffects:
    return ClaimEffects(devices=tuple(kind.build(tools) for kind in kinds), spec=CdiSpec.build(tools))
