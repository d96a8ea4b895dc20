"""What the node offers, every device kind's offer applied in one place from the slice settings in force: the
catalog (inventory/catalog.py) with each kind's node setting read from `SliceSettings`. The plugin's assembly
(plugin/nodedevices.py) calls `offered` and knows no kind: a new kind with a node-level setting adds its field to
`SliceSettings` and its line here (docs/architecture.md "Adding a device kind")."""

from __future__ import annotations

from dra_driver.inventory.catalog import AllocatableDevice, MigOffering, catalog
from dra_driver.inventory.fmpartitions import with_partitions
from dra_driver.inventory.model import NodeInventory
from dra_driver.inventory.passthrough import PassthroughSettings
from dra_driver.slices.builder import SliceSettings


def offered(
    inventory: NodeInventory, mig_offering: MigOffering, settings: SliceSettings, passthrough: PassthroughSettings
) -> dict[str, AllocatableDevice]:
    """Every allocatable device of the node, by name. `passthrough`: the settings with the node's IOMMU groups (what
    the assembly learnt this discovery; `settings.passthrough` until it is set)."""
    devices = catalog(inventory, mig_offering, settings.sharing, passthrough, settings.vgpu)
    if settings.fabric_partitions:
        devices = with_partitions(devices, inventory, inventory.fabric_partitions)
    return devices
