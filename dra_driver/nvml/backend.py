"""The project-owned NVML backend protocol.

Both the real backend (nvidia-ml-py) and the fake backend implement this. GPUs are addressed by
UUID, which stays stable when MIG mode changes (a minor number may not). Failures raise
`NvmlError` with the NVML return code; callers never see pynvml exceptions.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from dra_driver.nvml import types as nvt
from dra_driver.nvml.fabricmanager import FabricManager


@runtime_checkable
class NvmlBackend(Protocol):
    # --- lifecycle -------------------------------------------------------------------------
    def init(self) -> None:
        """Open NVML. Raises NvmlUnavailableError with a one-line, actionable reason."""

    def shutdown(self) -> None: ...

    # --- system and enumeration ------------------------------------------------------------
    def system_info(self) -> nvt.SystemInfo: ...

    def gpus(self) -> list[nvt.GpuInfo]:
        """Every physical GPU, ordered by NVML index."""

    # --- host locality and topology --------------------------------------------------------
    def numa_node(self, gpu_uuid: str) -> int | None:
        """Closest host NUMA node (memory affinity), None when unknown or single-node."""

    def numa_neighbours(self, numa_node: int) -> tuple[int, ...]:
        """The other host NUMA nodes on the same CPU socket as `numa_node` at the smallest SLIT distance from it,
        ascending; empty when there are none or the topology is unknown (KEP-6072's list form of numaNode)."""

    def cpu_affinity(self, gpu_uuid: str) -> tuple[int, ...]:
        """CPUs local to the GPU (ideal affinity), empty when unknown."""

    def pcie_root(self, gpu_uuid: str) -> str | None:
        """The PCIe root complex the GPU hangs off, e.g. "pci0000:00" (from sysfs)."""

    def topology_common_ancestor(self, gpu_a: str, gpu_b: str) -> nvt.TopologyLevel: ...

    def nvlinks(self, gpu_uuid: str) -> list[nvt.NvLink]:
        """Active NVLinks; empty when the GPU has none (NOT_SUPPORTED)."""

    def nvlink_p2p_ok(self, gpu_a: str, gpu_b: str) -> bool:
        """True when P2P over NVLink (direct or via NVSwitch) is possible between the two GPUs."""

    def fabric_info(self, gpu_uuid: str) -> nvt.FabricInfo | None:
        """The GPU's NVLink fabric registration (nvmlDeviceGetGpuFabricInfoV); None where the GPU has no fabric
        (NOT_SUPPORTED, or state NOT_SUPPORTED). The node's clique is derived from it in inventory/fabric.py."""

    # --- compute mode ----------------------------------------------------------------------
    def compute_mode(self, gpu_uuid: str) -> nvt.ComputeMode: ...

    def set_compute_mode(self, gpu_uuid: str, mode: nvt.ComputeMode) -> None: ...

    # --- time-slicing (per physical GPU) ---------------------------------------------------
    def time_slice(self, gpu_uuid: str) -> nvt.TimeSlice:
        """The GPU's compute-policy time-slice. Raises NvmlError(NOT_SUPPORTED) where it cannot be read."""

    def set_time_slice(self, gpu_uuid: str, value: nvt.TimeSlice) -> None:
        """Set the GPU's compute-policy time-slice (every process on the GPU). Raises NvmlError(NOT_SUPPORTED)
        on GPUs (or backends) that cannot do it."""

    # --- MIG -------------------------------------------------------------------------------
    def mig_mode(self, gpu_uuid: str) -> nvt.MigMode | None:
        """Current and pending MIG mode; None when the GPU is not MIG-capable."""

    def set_mig_mode(self, gpu_uuid: str, enabled: bool) -> nvt.NvmlReturn:
        """Request a MIG mode; returns the activation status (SUCCESS, IN_USE, RESET_REQUIRED …).
        Raises NvmlError only when the request itself fails (NO_PERMISSION, NOT_SUPPORTED)."""

    def gpu_instance_profiles(self, gpu_uuid: str) -> list[nvt.GpuInstanceProfile]:
        """Every GI profile the GPU supports, with its possible placements, ordered by index."""

    def create_gpu_instance(self, gpu_uuid: str, profile_id: int, placement: nvt.Placement) -> nvt.GpuInstance: ...

    def destroy_gpu_instance(self, gpu_uuid: str, gpu_instance_id: int) -> None: ...

    def gpu_instances(self, gpu_uuid: str) -> list[nvt.GpuInstance]:
        """Every live GPU instance on the GPU (all profiles), ordered by GI id."""

    def compute_instance_profiles(self, gpu_uuid: str, gpu_instance_id: int) -> list[nvt.ComputeInstanceProfile]: ...

    def create_compute_instance(self, gpu_uuid: str, gpu_instance_id: int, profile_id: int) -> nvt.ComputeInstance: ...

    def destroy_compute_instance(self, gpu_uuid: str, gpu_instance_id: int, compute_instance_id: int) -> None: ...

    def compute_instances(self, gpu_uuid: str, gpu_instance_id: int) -> list[nvt.ComputeInstance]: ...

    def mig_devices(self, gpu_uuid: str) -> list[nvt.MigDevice]:
        """Live MIG devices under the GPU with their own UUIDs (not the parent's)."""

    # --- health events ---------------------------------------------------------------------
    def register_events(self, gpu_uuids: list[str], event_mask: int) -> int:
        """Subscribe to events; returns the mask actually registered (supported types only)."""

    def wait_event(self, timeout_ms: int) -> nvt.GpuEvent | None:
        """Next event, or None on timeout. Raises NvmlError(GPU_IS_LOST) when a GPU fell off the bus."""

    # --- usage (read-only) -----------------------------------------------------------------
    def device_usage(self, uuid: str, *, held: bool = False) -> nvt.DeviceUtilisation:
        """One usage sample of a GPU ("GPU-…") or a MIG device ("MIG-…"); what the device cannot report is None.
        `held`: the driver has handed the device to a workload. Hardware measures and ignores it; the fake's load
        model uses it (docs/fake-nvml.md). Raises NvmlError (NOT_FOUND, GPU_IS_LOST) for a device it cannot read."""

    # --- passthrough (VFIO): what must hold before a GPU leaves the nvidia driver ----------------
    def running_processes(self, gpu_uuid: str) -> tuple[int, ...]:
        """PIDs of the compute and graphics processes on the GPU (its MIG instances' included), sorted, each once
        (nvmlDeviceGetComputeRunningProcesses, …GraphicsRunningProcesses, …MPSComputeRunningProcesses)."""

    def persistence_mode(self, gpu_uuid: str) -> bool:
        """nvmlDeviceGetPersistenceMode: whether the driver stays loaded on the GPU without a client."""

    def set_persistence_mode(self, gpu_uuid: str, enabled: bool) -> None:
        """nvmlDeviceSetPersistenceMode (root only)."""

    # --- vGPU (a vGPU host: NVIDIA vGPU Manager installed; docs/vgpu.md) -------------------------
    def vgpu_state(self, gpu_uuid: str) -> nvt.VgpuState | None:
        """The GPU's vGPU types, those it can create now and its live vGPUs' types; None where the GPU or driver
        has no vGPU (NOT_SUPPORTED: no vGPU Manager, or a GPU without vGPU)."""

    # --- Fabric Manager (an NVSwitch board in shared NVSwitch mode; docs/passthrough.md) -------------------
    def fabric_manager(self) -> FabricManager:
        """The node's Fabric Manager, beside NVML: the fake's, or the real-node stub (no client of the FM SDK yet)."""
