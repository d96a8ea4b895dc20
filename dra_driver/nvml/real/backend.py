"""RealNvml: the NvmlBackend protocol over nvidia-ml-py (module `pynvml`).

This class holds the session state: the init/shutdown reference count, where libnvidia-ml came from,
the UUID -> handle cache and the event set. The per-handle work lives in stateless helpers
(real_device, real_mig) that share one door to pynvml (real_calls), so nothing pynvml-shaped —
ctypes handles, byref arrays, c_uint results, NVMLError subclasses — reaches callers.
See docs/nvml-real.md for the quirks papered over here.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import subprocess
import threading
from collections.abc import Callable, Mapping
from typing import Any

import pynvml

from dra_driver.nvml import types as nvt
from dra_driver.nvml.fabricmanager import FabricManager, FabricManagerAddress, UnavailableFabricManager
from dra_driver.nvml.real import computepolicy, utilisation
from dra_driver.nvml.real import device as real_device
from dra_driver.nvml.real import mig as real_mig
from dra_driver.nvml.real import vgpu as real_vgpu
from dra_driver.nvml.real.calls import handle_address, nv
from dra_driver.nvml.real.fabricmanager import NvfmClient, with_module_ids
from dra_driver.nvml.real.loader import (
    driver_library_dirs,
    find_driver_library,
    init_failure_message,
    library_load_failed_message,
    stale_library_message,
)
from dra_driver.nvml.real.sysfs import numa_neighbours_from_sysfs


def _require_uuid(field: str, value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{field} must be a GPU UUID such as 'GPU-5d0e…' (see `nvidia-smi -L`), got {value!r}")
    return value


_NO_TIME_SLICE_CALL = "NVML has no call that reads the compute-policy time-slice (nvidia-smi only sets it)"


class RealNvml:
    """NvmlBackend over pynvml. Thread-safe: NVML itself is, and the caches here are guarded by a lock.

    driver_root: host driver root as mounted in the container (--driver-root); when libnvidia-ml.so.1
        is found under it, that exact file is the NVML used. None: the dynamic loader decides.
    sysfs_root: where sysfs is mounted ("/sys"); NUMA fallback and PCIe root are read from it.
    init_flags: nvmlInitWithFlags flags (0, or NVML_INIT_FLAG_NO_GPUS=1 to open NVML on a GPU-less node).
    fabric_manager: where the node's Fabric Manager is asked through its SDK (nvml/real/fabricmanager.py); None:
        it is not (`--fabric-partitions` off), and `fabric_manager()` refuses every call saying so.
    environ / load_library / machine: seams for tests (os.environ, ctypes.CDLL, platform.machine()).
    """

    def __init__(
        self,
        *,
        driver_root: str | None = None,
        sysfs_root: str = "/sys",
        init_flags: int = 0,
        environ: Mapping[str, str] | None = None,
        load_library: Callable[[str], object] | None = None,
        machine: str | None = None,
        run: computepolicy.Runner = subprocess.run,
        fabric_manager: FabricManagerAddress | None = None,
    ) -> None:
        self._run = run
        self._driver_root = driver_root
        self._sysfs_root = sysfs_root
        self._init_flags = init_flags
        self._environ: Mapping[str, str] = environ if environ is not None else os.environ
        self._load_library: Callable[[str], object] = load_library if load_library is not None else ctypes.CDLL
        self._machine = machine if machine is not None else platform.machine()
        self._lock = threading.Lock()
        self._refcount = 0
        self._preloaded: object | None = None  # keeps the preloaded library object referenced
        self._library_path: str | None = None
        self._handles: dict[str, Any] = {}
        self._event_set: Any = None
        self._event_uuids: dict[int, str] = {}
        self._opened_before = False  # nvmlInit succeeded once in this process (a later failure may be a stale library)
        self._fabric_manager: FabricManager = (
            with_module_ids(
                NvfmClient(fabric_manager, driver_root=driver_root, machine=self._machine), self._gpus_by_module_id
            )
            if fabric_manager is not None
            else UnavailableFabricManager()
        )
        self._module_ids: dict[int, tuple[str, str]] = {}

    @property
    def library_path(self) -> str | None:
        """The libnvidia-ml file loaded from the driver root, or None when the loader search chose."""
        return self._library_path

    # --- session and handle cache --------------------------------------------------------------
    def _require_init(self, op: str) -> None:
        with self._lock:
            if self._refcount == 0:
                raise nvt.NvmlError(nvt.NvmlReturn.UNINITIALIZED, call=op, detail="call RealNvml.init() first")

    def _handle(self, gpu_uuid: str, op: str, field: str = "gpu_uuid") -> Any:
        """UUID -> device handle, cached: an uncached nvmlDeviceGetHandleByUUID can take seconds."""
        _require_uuid(field, gpu_uuid)
        self._require_init(op)
        with self._lock:
            cached = self._handles.get(gpu_uuid)
        if cached is not None:
            return cached
        # Looked up outside the lock so one slow lookup does not stall every other caller.
        handle = nv("nvmlDeviceGetHandleByUUID", gpu_uuid, detail=f"uuid {gpu_uuid}")
        if gpu_uuid.startswith("MIG-"):
            return handle  # MIG handles die with their instance: never cache them
        with self._lock:
            return self._handles.setdefault(gpu_uuid, handle)

    # --- lifecycle -----------------------------------------------------------------------------
    def init(self) -> None:
        """Open NVML (the first call) or take another reference (later calls); balance with shutdown()."""
        with self._lock:
            if self._refcount > 0:
                self._refcount += 1
                return
            self._open()
            self._refcount = 1
            self._opened_before = True

    def _open(self) -> None:
        searched: tuple[str, ...] = ()
        library: str | None = None
        if self._driver_root is not None:
            searched = driver_library_dirs(self._driver_root, self._machine)
            library = find_driver_library(searched)
            if library is not None:
                # Preload by absolute path: pynvml's later dlopen("libnvidia-ml.so.1") matches this object's
                # DT_SONAME and reuses it instead of searching the loader path (see real_loader).
                try:
                    self._preloaded = self._load_library(library)
                except OSError as exc:
                    raise nvt.NvmlUnavailableError(library_load_failed_message(library, exc)) from exc
                self._library_path = library
        try:
            pynvml.nvmlInitWithFlags(self._init_flags)
        except pynvml.NVMLError as exc:
            err = nvt.NvmlError(int(exc.value), call="nvmlInitWithFlags")
            err.__cause__ = exc
            message = init_failure_message(
                err.code,
                library=library,
                driver_root=self._driver_root,
                searched=searched,
                ld_library_path=self._environ.get("LD_LIBRARY_PATH"),
            )
            if err.code is nvt.NvmlReturn.LIB_RM_VERSION_MISMATCH and self._opened_before:
                # Worked before in this process: the kernel module changed under it (a driver upgrade), and the
                # library dlopen'ed at the first init (pynvml never unloads it) is the old driver's.
                raise nvt.NvmlLibraryStaleError(stale_library_message(library)) from err
            raise nvt.NvmlUnavailableError(message) from err

    def shutdown(self) -> None:
        """Drop one reference; the last one closes NVML. An extra shutdown is a no-op, so a
        `finally: shutdown()` after a failed init is safe. Stop any wait_event caller first."""
        with self._lock:
            if self._refcount == 0:
                return
            self._refcount -= 1
            if self._refcount > 0:
                return
            event_set, self._event_set = self._event_set, None
            self._event_uuids.clear()
            # Handles are only valid inside the NVML session that produced them.
            self._handles.clear()
        if event_set is not None:
            # A failed free is harmless: the set dies with the session below anyway.
            with contextlib.suppress(nvt.NvmlError):
                nv("nvmlEventSetFree", event_set)
        nv("nvmlShutdown")

    # --- system and enumeration ----------------------------------------------------------------
    def system_info(self) -> nvt.SystemInfo:
        self._require_init("system_info")
        return nvt.SystemInfo(
            driver_version=str(nv("nvmlSystemGetDriverVersion")),
            cuda_driver_version=int(nv("nvmlSystemGetCudaDriverVersion_v2")),
            nvml_version=str(nv("nvmlSystemGetNVMLVersion")),
        )

    def gpus(self) -> list[nvt.GpuInfo]:
        self._require_init("gpus")
        out: list[nvt.GpuInfo] = []
        for index in range(int(nv("nvmlDeviceGetCount"))):
            handle = nv("nvmlDeviceGetHandleByIndex", index)
            info = real_device.identity(index, handle)
            with self._lock:  # enumeration warms the cache for free
                self._handles.setdefault(info.uuid, handle)
            out.append(info)
        return out

    # --- host locality and topology ------------------------------------------------------------
    def numa_node(self, gpu_uuid: str) -> int | None:
        return real_device.numa_node(self._handle(gpu_uuid, "numa_node"), self._sysfs_root)

    def numa_neighbours(self, numa_node: int) -> tuple[int, ...]:
        return numa_neighbours_from_sysfs(self._sysfs_root, numa_node)

    def cpu_affinity(self, gpu_uuid: str) -> tuple[int, ...]:
        return real_device.cpu_affinity(self._handle(gpu_uuid, "cpu_affinity"))

    def pcie_root(self, gpu_uuid: str) -> str | None:
        return real_device.pcie_root(self._handle(gpu_uuid, "pcie_root"), self._sysfs_root)

    def topology_common_ancestor(self, gpu_a: str, gpu_b: str) -> nvt.TopologyLevel:
        op = "topology_common_ancestor"
        return real_device.topology_common_ancestor(self._handle(gpu_a, op, "gpu_a"), self._handle(gpu_b, op, "gpu_b"))

    def nvlinks(self, gpu_uuid: str) -> list[nvt.NvLink]:
        return real_device.nvlinks(self._handle(gpu_uuid, "nvlinks"))

    def nvlink_p2p_ok(self, gpu_a: str, gpu_b: str) -> bool:
        op = "nvlink_p2p_ok"
        return real_device.nvlink_p2p_ok(self._handle(gpu_a, op, "gpu_a"), self._handle(gpu_b, op, "gpu_b"))

    def fabric_info(self, gpu_uuid: str) -> nvt.FabricInfo | None:
        return real_device.fabric_info(self._handle(gpu_uuid, "fabric_info"))

    # --- vGPU ------------------------------------------------------------------------------------
    def vgpu_state(self, gpu_uuid: str) -> nvt.VgpuState | None:
        return real_vgpu.read_vgpu_state(self._handle(gpu_uuid, "vgpu_state"))

    # --- Fabric Manager --------------------------------------------------------------------------
    def fabric_manager(self) -> FabricManager:
        return self._fabric_manager

    def _gpus_by_module_id(self) -> dict[int, tuple[str, str]]:
        """(UUID, PCI bus id) of each GPU by its module id (nvmlDeviceGetModuleId), which FM reports as a partition
        member's physical id and, on H100 and later boards, in place of its UUID and bus id. Remembered for the
        process: a member bound to vfio-pci is gone from NVML but keeps its module id."""
        with self._lock:
            if self._refcount == 0:
                return dict(self._module_ids)
        found: dict[int, tuple[str, str]] = {}
        for index in range(int(nv("nvmlDeviceGetCount"))):
            handle = nv("nvmlDeviceGetHandleByIndex", index)
            try:
                module = int(nv("nvmlDeviceGetModuleId", handle))
            except nvt.NvmlError:
                continue  # no module id (not an SXM board, or a driver without the call)
            found[module] = (str(nv("nvmlDeviceGetUUID", handle)), real_device.bus_id(handle))
        with self._lock:
            self._module_ids.update(found)
            return dict(self._module_ids)

    # --- passthrough (VFIO) --------------------------------------------------------------------
    def running_processes(self, gpu_uuid: str) -> tuple[int, ...]:
        return real_device.running_processes(self._handle(gpu_uuid, "running_processes"))

    def persistence_mode(self, gpu_uuid: str) -> bool:
        return real_device.persistence_mode(self._handle(gpu_uuid, "persistence_mode"))

    def set_persistence_mode(self, gpu_uuid: str, enabled: bool) -> None:
        real_device.set_persistence_mode(self._handle(gpu_uuid, "set_persistence_mode"), enabled)

    # --- compute mode --------------------------------------------------------------------------
    def compute_mode(self, gpu_uuid: str) -> nvt.ComputeMode:
        return real_device.compute_mode(self._handle(gpu_uuid, "compute_mode"))

    def set_compute_mode(self, gpu_uuid: str, mode: nvt.ComputeMode) -> None:
        real_device.set_compute_mode(self._handle(gpu_uuid, "set_compute_mode"), mode)

    # --- time-slicing --------------------------------------------------------------------------
    # NVML has no call for the compute-policy time-slice (`nvidia-smi compute-policy --set-timeslice`); its
    # "timeslice" calls are the vGPU scheduler's, which answer NOT_SUPPORTED outside vGPU host mode and are not a
    # substitute. Until the driver runs nvidia-smi for it, every GPU reports NOT_SUPPORTED here, so a TimeSlicing
    # claim fails with a clear per-claim error and nothing else is affected. The GPU must still exist.
    def time_slice(self, gpu_uuid: str) -> nvt.TimeSlice:
        self._handle(gpu_uuid, "time_slice")
        raise nvt.NvmlError(nvt.NvmlReturn.NOT_SUPPORTED, call="time_slice", detail=_NO_TIME_SLICE_CALL)

    def set_time_slice(self, gpu_uuid: str, value: nvt.TimeSlice) -> None:
        self._handle(gpu_uuid, "set_time_slice")  # an unknown GPU fails here, before any program runs
        nvidia_smi = computepolicy.find_nvidia_smi(self._driver_root)
        searched = [os.path.join(self._driver_root or "", d) for d in computepolicy.NVIDIA_SMI_DIRS]
        computepolicy.set_time_slice(
            nvidia_smi, gpu_uuid, value, library_path=self._library_path, run=self._run, searched=searched
        )

    # --- MIG -----------------------------------------------------------------------------------
    def mig_mode(self, gpu_uuid: str) -> nvt.MigMode | None:
        return real_mig.mig_mode(self._handle(gpu_uuid, "mig_mode"))

    def set_mig_mode(self, gpu_uuid: str, enabled: bool) -> nvt.NvmlReturn:
        status = real_mig.set_mig_mode(self._handle(gpu_uuid, "set_mig_mode"), enabled)
        with self._lock:
            # The toggle may unbind or reset the GPU; resolve the handle afresh next time.
            self._handles.pop(gpu_uuid, None)
        return status

    def gpu_instance_profiles(self, gpu_uuid: str) -> list[nvt.GpuInstanceProfile]:
        return real_mig.gpu_instance_profiles(self._handle(gpu_uuid, "gpu_instance_profiles"))

    def create_gpu_instance(self, gpu_uuid: str, profile_id: int, placement: nvt.Placement) -> nvt.GpuInstance:
        handle = self._handle(gpu_uuid, "create_gpu_instance")
        return real_mig.create_gpu_instance(handle, gpu_uuid, profile_id, placement)

    def destroy_gpu_instance(self, gpu_uuid: str, gpu_instance_id: int) -> None:
        real_mig.destroy_gpu_instance(self._handle(gpu_uuid, "destroy_gpu_instance"), gpu_instance_id)

    def gpu_instances(self, gpu_uuid: str) -> list[nvt.GpuInstance]:
        return real_mig.gpu_instances(self._handle(gpu_uuid, "gpu_instances"), gpu_uuid)

    def compute_instance_profiles(self, gpu_uuid: str, gpu_instance_id: int) -> list[nvt.ComputeInstanceProfile]:
        handle = self._handle(gpu_uuid, "compute_instance_profiles")
        return real_mig.compute_instance_profiles(handle, gpu_instance_id)

    def create_compute_instance(self, gpu_uuid: str, gpu_instance_id: int, profile_id: int) -> nvt.ComputeInstance:
        handle = self._handle(gpu_uuid, "create_compute_instance")
        return real_mig.create_compute_instance(handle, gpu_uuid, gpu_instance_id, profile_id)

    def destroy_compute_instance(self, gpu_uuid: str, gpu_instance_id: int, compute_instance_id: int) -> None:
        handle = self._handle(gpu_uuid, "destroy_compute_instance")
        real_mig.destroy_compute_instance(handle, gpu_instance_id, compute_instance_id)

    def compute_instances(self, gpu_uuid: str, gpu_instance_id: int) -> list[nvt.ComputeInstance]:
        return real_mig.compute_instances(self._handle(gpu_uuid, "compute_instances"), gpu_uuid, gpu_instance_id)

    def mig_devices(self, gpu_uuid: str) -> list[nvt.MigDevice]:
        return real_mig.mig_devices(self._handle(gpu_uuid, "mig_devices"), gpu_uuid)

    # --- usage ---------------------------------------------------------------------------------
    def device_usage(self, uuid: str, *, held: bool = False) -> nvt.DeviceUtilisation:
        """A GPU or MIG device by UUID (nvmlDeviceGetHandleByUUID takes both); `held` is for the fake only."""
        return utilisation.sample(self._handle(uuid, "device_usage", "uuid"), mig=uuid.startswith("MIG-"))

    # --- health events -------------------------------------------------------------------------
    def register_events(self, gpu_uuids: list[str], event_mask: int) -> int:
        """Add the GPUs to this backend's one event set (created on first use). A GPU that supports none
        of the requested types, or events at all (NOT_SUPPORTED), is skipped. Returns the union of the
        masks actually registered."""
        if not isinstance(event_mask, int) or event_mask < 0:
            raise ValueError(f"event_mask must be a non-negative nvmlEventType bitmask, got {event_mask!r}")
        handles = [(u, self._handle(u, "register_events", "gpu_uuids[]")) for u in gpu_uuids]
        with self._lock:
            # Created under the lock so concurrent callers share one set. It is never replaced while
            # alive: another thread may be blocked on it in wait_event.
            if self._event_set is None:
                self._event_set = nv("nvmlEventSetCreate")
            event_set = self._event_set
        registered = 0
        for gpu_uuid, handle in handles:
            try:
                mask = event_mask & int(nv("nvmlDeviceGetSupportedEventTypes", handle))
                if mask == 0:
                    continue
                nv("nvmlDeviceRegisterEvents", handle, mask, event_set)
            except nvt.NvmlError as err:
                if err.code is nvt.NvmlReturn.NOT_SUPPORTED:
                    continue
                raise
            registered |= mask
            with self._lock:
                self._event_uuids[handle_address(handle)] = gpu_uuid
        return registered

    def wait_event(self, timeout_ms: int) -> nvt.GpuEvent | None:
        if not isinstance(timeout_ms, int) or timeout_ms < 0:
            raise ValueError(f"timeout_ms must be a non-negative number of milliseconds, got {timeout_ms!r}")
        self._require_init("wait_event")
        with self._lock:
            event_set = self._event_set
        if event_set is None:
            raise nvt.NvmlError(nvt.NvmlReturn.UNINITIALIZED, call="wait_event", detail="call register_events() first")
        # Outside the lock: this blocks for up to timeout_ms.
        try:
            data = nv("nvmlEventSetWait_v2", event_set, timeout_ms)
        except nvt.NvmlError as err:
            if err.code is nvt.NvmlReturn.TIMEOUT:
                return None
            raise  # GPU_IS_LOST and friends reach the health monitor as they are
        return nvt.GpuEvent(
            gpu_uuid=self._event_uuid(data.device),
            event_type=int(data.eventType),
            data=int(data.eventData),
            gpu_instance_id=int(data.gpuInstanceId),
            compute_instance_id=int(data.computeInstanceId),
        )

    def _event_uuid(self, device: Any) -> str:
        with self._lock:
            known = self._event_uuids.get(handle_address(device))
        if known is not None:
            return known
        # Not a handle registered here (should not happen): ask NVML. Failing here usually means the GPU
        # fell off the bus, and the NvmlError propagates as such.
        return str(nv("nvmlDeviceGetUUID", device))
