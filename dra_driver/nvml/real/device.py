"""Per-handle queries of one physical GPU: identity, host locality, topology, fabric, compute mode.

Stateless: every function takes a pynvml device handle and returns plain values. The handle cache
and the session live in real.py.
"""

from __future__ import annotations

import ctypes
from typing import Any

import pynvml

from dra_driver.nvml.real.calls import MISSING, nv
from dra_driver.nvml.real.convert import brand_name, normalize_pci_bus_id, set_bits, uuid_text
from dra_driver.nvml.real.sysfs import numa_node_from_sysfs, pcie_root_from_sysfs
from dra_driver.nvml.types import (
    Architecture,
    ComputeMode,
    FabricInfo,
    FabricState,
    GpuInfo,
    NvLink,
    NvLinkRemoteType,
    NvmlError,
    NvmlReturn,
    TopologyLevel,
)

# Literals rather than pynvml constants: pynvml's NVML_P2P_CAPS_INDEX_READ is the tuple (0,), so the
# family is spelled out here from nvml.h.
P2P_CAPS_INDEX_NVLINK = 2
P2P_STATUS_OK = 0
AFFINITY_SCOPE_NODE = 0
NVLINK_STATE_ACTIVE = 1
# Bitmask sizes in 64-bit words: 1024 NUMA nodes and 4096 CPUs cover every kernel config shipped today.
NODE_SET_WORDS = 16
CPU_SET_WORDS = 64

_FABRIC_V_FALLBACK = frozenset({NvmlReturn.FUNCTION_NOT_FOUND, NvmlReturn.ARGUMENT_VERSION_MISMATCH})


def _unless_not_supported(name: str, handle: Any) -> Any:
    try:
        return nv(name, handle)
    except NvmlError as err:
        if err.code is NvmlReturn.NOT_SUPPORTED:
            return None
        raise


def memory_total(handle: Any) -> int | None:
    """Framebuffer total in bytes; None where NVML reports NOT_SUPPORTED (some integrated/coherent parts)."""
    info = _unless_not_supported("nvmlDeviceGetMemoryInfo", handle)
    return int(info.total) if info is not None else None


def bus_id(handle: Any) -> str:
    return normalize_pci_bus_id(str(nv("nvmlDeviceGetPciInfo", handle).busId))


def identity(index: int, handle: Any) -> GpuInfo:
    pci = nv("nvmlDeviceGetPciInfo", handle)
    major, minor = nv("nvmlDeviceGetCudaComputeCapability", handle)
    try:
        arch = Architecture.from_code(int(nv("nvmlDeviceGetArchitecture", handle)))
    except NvmlError as err:
        if err.code not in MISSING:
            raise
        arch = Architecture.UNKNOWN
    serial = _unless_not_supported("nvmlDeviceGetSerial", handle)
    return GpuInfo(
        index=index,
        minor=int(nv("nvmlDeviceGetMinorNumber", handle)),
        uuid=str(nv("nvmlDeviceGetUUID", handle)),
        name=str(nv("nvmlDeviceGetName", handle)),
        brand=brand_name(int(nv("nvmlDeviceGetBrand", handle))),
        architecture=arch,
        cuda_compute_capability=(int(major), int(minor)),
        memory_total_bytes=memory_total(handle),
        pci_bus_id=normalize_pci_bus_id(str(pci.busId)),
        pci_device_id=int(pci.pciDeviceId),
        serial=str(serial) if serial is not None else None,
    )


def numa_node(handle: Any, sysfs_root: str) -> int | None:
    # Memory affinity is the host-NUMA answer on x86; nvmlDeviceGetNumaNodeId only applies to coherent
    # platforms where the GPU itself is a NUMA node.
    try:
        words = nv("nvmlDeviceGetMemoryAffinity", handle, NODE_SET_WORDS, AFFINITY_SCOPE_NODE)
    except NvmlError as err:
        if err.code not in MISSING:
            raise
    else:
        nodes = set_bits(words)
        if len(nodes) == 1:
            return nodes[0]
    # No answer, or an ambiguous one (no node or several): ask the kernel.
    return numa_node_from_sysfs(sysfs_root, bus_id(handle))


def cpu_affinity(handle: Any) -> tuple[int, ...]:
    try:
        words = nv("nvmlDeviceGetCpuAffinity", handle, CPU_SET_WORDS)
    except NvmlError as err:
        if err.code in MISSING:
            return ()
        raise
    return set_bits(words)


def pcie_root(handle: Any, sysfs_root: str) -> str | None:
    return pcie_root_from_sysfs(sysfs_root, bus_id(handle))


def topology_common_ancestor(handle_a: Any, handle_b: Any) -> TopologyLevel:
    level = int(nv("nvmlDeviceGetTopologyCommonAncestor", handle_a, handle_b))
    try:
        return TopologyLevel(level)
    except ValueError:
        # A level newer than this code: assume the farthest, so nothing is placed too optimistically.
        return TopologyLevel.SYSTEM


def nvlinks(handle: Any) -> list[NvLink]:
    links: list[NvLink] = []
    for link in range(int(pynvml.NVML_NVLINK_MAX_LINKS)):
        try:
            state = int(nv("nvmlDeviceGetNvLinkState", handle, link))
        except NvmlError as err:
            if err.code is NvmlReturn.INVALID_ARGUMENT:
                break  # past the GPU's last link
            if err.code is NvmlReturn.NOT_SUPPORTED:
                continue  # no NVLink at all, or this link index does not exist on this board
            raise
        if state != NVLINK_STATE_ACTIVE:
            continue
        remote = nv("nvmlDeviceGetNvLinkRemotePciInfo", handle, link)
        links.append(
            NvLink(
                link=link,
                remote_type=_remote_type(handle, link),
                remote_pci_bus_id=normalize_pci_bus_id(str(remote.busId)),
            )
        )
    return links


def _remote_type(handle: Any, link: int) -> NvLinkRemoteType:
    try:
        code = int(nv("nvmlDeviceGetNvLinkRemoteDeviceType", handle, link))
    except NvmlError as err:
        if err.code in MISSING:
            return NvLinkRemoteType.UNKNOWN
        raise
    try:
        return NvLinkRemoteType(code)
    except ValueError:
        return NvLinkRemoteType.UNKNOWN


def nvlink_p2p_ok(handle_a: Any, handle_b: Any) -> bool:
    try:
        status = int(nv("nvmlDeviceGetP2PStatus", handle_a, handle_b, P2P_CAPS_INDEX_NVLINK))
    except NvmlError as err:
        if err.code in MISSING:
            return False
        raise
    return status == P2P_STATUS_OK


def fabric_info(handle: Any) -> FabricInfo | None:
    """Fabric state; None where the GPU has no fabric (NOT_SUPPORTED, or state NOT_SUPPORTED)."""
    raw = _fabric_raw(handle)
    if raw is None:
        return None
    state_code = int(raw.state)
    if state_code == FabricState.NOT_SUPPORTED:
        return None
    try:
        state = FabricState(state_code)
    except ValueError:
        state = FabricState.NOT_STARTED  # an unknown state is certainly not a usable clique
    return FabricInfo(
        state=state,
        status=NvmlReturn.from_code(int(raw.status)),
        clique_id=int(raw.cliqueId),
        cluster_uuid=uuid_text(bytes(raw.clusterUuid)),
    )


def _fabric_raw(handle: Any) -> Any:
    """The versioned call with a caller-allocated struct (its constructor presets `version`), falling
    back to the deprecated v1 call on drivers or pynvml releases without it. The wrappers return 0, not
    the struct: NVML fills ours through byref."""
    if hasattr(pynvml, "nvmlDeviceGetGpuFabricInfoV") and hasattr(pynvml, "c_nvmlGpuFabricInfoV_t"):
        info = pynvml.c_nvmlGpuFabricInfoV_t()
        try:
            nv("nvmlDeviceGetGpuFabricInfoV", handle, ctypes.byref(info))
        except NvmlError as err:
            if err.code is NvmlReturn.NOT_SUPPORTED:
                return None
            if err.code not in _FABRIC_V_FALLBACK:
                raise
        else:
            return info
    legacy = pynvml.c_nvmlGpuFabricInfo_t()
    try:
        nv("nvmlDeviceGetGpuFabricInfo", handle, ctypes.byref(legacy))
    except NvmlError as err:
        if err.code in MISSING:
            return None
        raise
    return legacy


def compute_mode(handle: Any) -> ComputeMode:
    code = int(nv("nvmlDeviceGetComputeMode", handle))
    try:
        return ComputeMode(code)
    except ValueError:
        raise NvmlError(
            NvmlReturn.UNKNOWN, call="nvmlDeviceGetComputeMode", detail=f"unknown compute mode {code}"
        ) from None


def set_compute_mode(handle: Any, mode: ComputeMode) -> None:
    if not isinstance(mode, ComputeMode):
        names = ", ".join(m.name for m in ComputeMode)
        raise ValueError(f"mode must be a ComputeMode ({names}), got {mode!r}")
    nv("nvmlDeviceSetComputeMode", handle, int(mode))


# NVML's process lists: compute (CUDA), graphics and MPS clients; a GPU a VM is to get must have none of them.
PROCESS_LISTS = (
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetGraphicsRunningProcesses",
    "nvmlDeviceGetMPSComputeRunningProcesses",
)


def running_processes(handle: Any) -> tuple[int, ...]:
    pids: set[int] = set()
    for name in PROCESS_LISTS:
        try:
            listed = nv(name, handle)
        except NvmlError as exc:
            if exc.code in (NvmlReturn.NOT_SUPPORTED, NvmlReturn.FUNCTION_NOT_FOUND):
                continue  # an older driver without the MPS list, or a GPU without graphics
            raise
        pids.update(int(p.pid) for p in listed)
    return tuple(sorted(pids))


def persistence_mode(handle: Any) -> bool:
    return bool(int(nv("nvmlDeviceGetPersistenceMode", handle)) == int(pynvml.NVML_FEATURE_ENABLED))


def set_persistence_mode(handle: Any, enabled: bool) -> None:
    mode = pynvml.NVML_FEATURE_ENABLED if enabled else pynvml.NVML_FEATURE_DISABLED
    nv("nvmlDeviceSetPersistenceMode", handle, mode)
