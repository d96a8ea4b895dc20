"""Pure inventory of a node's GPUs, read through an NVML backend."""

from dra_driver.inventory.discover import discover
from dra_driver.inventory.model import GpuInventory, GpuTopology, MigDeviceInventory, NodeInventory

__all__ = ["GpuInventory", "GpuTopology", "MigDeviceInventory", "NodeInventory", "discover"]
