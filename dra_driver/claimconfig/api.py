"""Types of the opaque device configuration users put in DeviceClasses and ResourceClaims.

apiVersion: gpu.dra.dev/v1beta1
kind: GpuConfig            # or MigDeviceConfig
sharing:
  strategy: TimeSlicing    # Exclusive (default) | TimeSlicing | MPS
  timeSlicingConfig:       # GpuConfig only: MIG devices cannot be time-sliced
    interval: Short        # Default | Short | Medium | Long
  mpsConfig:
    defaultActiveThreadPercentage: 50
    defaultPinnedDeviceMemoryLimit: 10Gi
    defaultPerDevicePinnedMemoryLimit: {"0": 5Gi}   # key: device UUID or index in the claim
    multiUser: true                                 # clients of different UIDs share one server

apiVersion: gpu.dra.dev/v1beta1
kind: VfioDeviceConfig     # a GPU passed through to a VM (device type vfio; docs/passthrough.md)
iommu:
  backendPolicy: LegacyOnly    # LegacyOnly (default): /dev/vfio/<group> | PreferIommuFD: /dev/vfio/devices/vfioN
  enableAPIDevice: true        # also hand out /dev/vfio/vfio (or /dev/iommu with IOMMUFD); KubeVirt needs it

These are the decoded values the plugin acts on; the document as users write it (and its JSON schema) is
described by the models in `decode.py`.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from dra_driver.errors import DecodeError

API_GROUP = "gpu.dra.dev"
API_VERSION = f"{API_GROUP}/v1beta1"


class ConfigError(DecodeError):
    """Invalid opaque config. `path` is the JSON path of the (first) offending field; `problems` lists all."""


class SharingStrategy(enum.StrEnum):
    EXCLUSIVE = "Exclusive"
    TIME_SLICING = "TimeSlicing"
    MPS = "MPS"


class TimeSliceInterval(enum.StrEnum):
    DEFAULT = "Default"
    SHORT = "Short"
    MEDIUM = "Medium"
    LONG = "Long"

    @property
    def nvidia_smi_value(self) -> int:
        """The value `nvidia-smi compute-policy --set-timeslice` takes."""
        return list(TimeSliceInterval).index(self)


@dataclass(frozen=True)
class MpsConfig:
    """The MPS settings of a shared device: the clients' active thread share and pinned memory limits."""

    default_active_thread_percentage: int | None = None
    default_pinned_device_memory_limit: int | None = None  # bytes
    # Key: a device UUID, or the index of the device within the claim's devices.
    default_per_device_pinned_memory_limit: Mapping[str, int] = field(default_factory=dict)
    multi_user: bool = False  # clients of every UID share one server (`nvidia-cuda-mps-control -M`, Volta+)


@dataclass(frozen=True)
class Sharing:
    """How a claim's device is shared by the containers that use the claim: exclusive, time-sliced or through MPS."""

    strategy: SharingStrategy = SharingStrategy.EXCLUSIVE
    time_slice_interval: TimeSliceInterval | None = None
    mps: MpsConfig | None = None

    @property
    def shared(self) -> bool:
        return self.strategy is not SharingStrategy.EXCLUSIVE


@dataclass(frozen=True)
class GpuConfig:
    """The opaque config (`GpuConfig`) of a claim's whole GPUs."""

    sharing: Sharing = Sharing()
    kind: str = "GpuConfig"
    device_type: str = "gpu"


@dataclass(frozen=True)
class MigDeviceConfig:
    """The opaque config (`MigDeviceConfig`) of a claim's MIG devices."""

    sharing: Sharing = Sharing()
    kind: str = "MigDeviceConfig"
    device_type: str = "mig"


class IommuBackendPolicy(enum.StrEnum):
    """Which VFIO interface the VM process gets (NVIDIA's `iommu.backendPolicy`)."""

    LEGACY_ONLY = "LegacyOnly"  # the group's /dev/vfio/<group> (KubeVirt today)
    PREFER_IOMMU_FD = "PreferIommuFD"  # the device's /dev/vfio/devices/vfioN where the host has /dev/iommu


@dataclass(frozen=True)
class VfioDeviceConfig:
    """The opaque config (`VfioDeviceConfig`) of a GPU passed through to a VM over VFIO."""

    backend_policy: IommuBackendPolicy = IommuBackendPolicy.LEGACY_ONLY
    enable_api_device: bool = False
    sharing: Sharing = Sharing()  # a passed-through GPU is the VM's alone
    kind: str = "VfioDeviceConfig"
    device_type: str = "vfio"


DeviceConfig = GpuConfig | MigDeviceConfig | VfioDeviceConfig
# The config kind each device type takes (resolve.py).
CONFIG_KINDS = {"gpu": "GpuConfig", "mig": "MigDeviceConfig", "vfio": "VfioDeviceConfig"}
