"""NVIDIA Fabric Manager's shared-NVSwitch partitions (docs/passthrough.md "Fabric Manager partitions"): the
model of the FM SDK's answers (`fmGetSupportedFabricPartitions`, `fmActivateFabricPartition`,
`fmDeactivateFabricPartition`, `fmSetActivatedFabricPartitions`; return codes `fmReturn_t` of `nv_fm_types.h`), the
`FabricManager` protocol the plugin drives, and what it gets where no Fabric Manager SDK is reachable.

Only the fake (nvml/fake/fmpartitions.py) answers today: no client of the real SDK (libnvfm over FM's socket) is
written or tested, so on a real node the backend's `fabric_manager()` (nvml/backend.py) is `UnavailableFabricManager`,
which refuses every call with NOT_SUPPORTED and says so.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol


class FmReturn(enum.IntEnum):
    """`fmReturn_t` (nv_fm_types.h): 0 success, negative errors."""

    SUCCESS = 0
    BADPARAM = -1
    GENERIC_ERROR = -2
    NOT_SUPPORTED = -3
    UNINITIALIZED = -4
    TIMEOUT = -5
    VERSION_MISMATCH = -6
    IN_USE = -7
    NOT_CONFIGURED = -8
    CONNECTION_NOT_VALID = -9
    NVLINK_ERROR = -10


class FabricManagerError(Exception):
    """A Fabric Manager call failed with `code` (FM_ST_<code>)."""

    def __init__(self, code: FmReturn, message: str) -> None:
        super().__init__(f"{message} (FM_ST_{code.name})")
        self.code = code


@dataclass(frozen=True)
class PartitionGpu:
    """One GPU of a partition (`fmFabricPartitionGpuInfo_t`)."""

    physical_id: int  # the GPU's module id on the baseboard
    uuid: str
    pci_bus_id: str  # as FM reports it, e.g. "00000000:1B:00.0"
    nvlinks: int  # NVLinks available for use (numNvLinksAvailable)


@dataclass(frozen=True)
class FabricPartition:
    """One predefined partition (`fmFabricPartitionInfo_t`)."""

    id: int
    active: bool
    gpus: tuple[PartitionGpu, ...]


class FabricManager(Protocol):
    """The FM SDK calls the plugin makes. Each raises FabricManagerError with FM's return code."""

    def supported_partitions(self) -> tuple[FabricPartition, ...]: ...

    def activate(self, partition_id: int) -> None: ...

    def deactivate(self, partition_id: int) -> None: ...

    def set_activated(self, partition_ids: tuple[int, ...]) -> None: ...


SDK_UNAVAILABLE = (
    "Fabric Manager SDK not available: this driver has no client of the real FM SDK yet (only the fake node "
    "answers, knob fabric_partitions=true); run without --fabric-partitions"
)


class UnavailableFabricManager:
    """What a real node gets: every call refused with NOT_SUPPORTED, saying why (never a silent success)."""

    def supported_partitions(self) -> tuple[FabricPartition, ...]:
        raise FabricManagerError(FmReturn.NOT_SUPPORTED, SDK_UNAVAILABLE)

    def activate(self, partition_id: int) -> None:
        raise FabricManagerError(FmReturn.NOT_SUPPORTED, SDK_UNAVAILABLE)

    def deactivate(self, partition_id: int) -> None:
        raise FabricManagerError(FmReturn.NOT_SUPPORTED, SDK_UNAVAILABLE)

    def set_activated(self, partition_ids: tuple[int, ...]) -> None:
        raise FabricManagerError(FmReturn.NOT_SUPPORTED, SDK_UNAVAILABLE)
