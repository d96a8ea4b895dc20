"""The client of NVIDIA's Fabric Manager SDK, `libnvfm`, through ctypes (docs/passthrough.md "Fabric Manager
partitions", "The real client"): the `FabricManager` protocol (nvml/fabricmanager.py) on a real NVSwitch node.

Each operation is a whole session of its own, under one lock: fmLibInit → fmConnect → the call → fmDisconnect →
fmLibShutdown. No handle outlives a call, so an FM restart between two calls is survived (the next call connects to
the new instance), and fmLibInit/fmLibShutdown, which are process-wide, are never interleaved by two threads.

The structs are laid out as `nv_fm_types.h` declares them and every versioned struct carries the version NVIDIA's
macro makes, `sizeof(struct) | (version << 24)`; the versions are the header's (fmConnectParams_v2: 2;
fmFabricPartitionList_v2: 1, as the header has it; fmActivatedFabricPartitionList_v1: 1).

What FM answers is untrusted: a list with more than FM_MAX_FABRIC_PARTITIONS partitions or FM_MAX_NUM_GPUS GPUs in
one, a string without its NUL, two partitions with one id, or an isActive other than 0/1 is refused with a
FabricManagerError naming the field; nothing of such a list is used.

Where the library cannot be loaded, lacks an entry point, or FM does not answer, every call raises a
FabricManagerError whose message starts "Fabric Manager SDK not available:" and says why and what to set; discovery
then offers no partition and a prepare is refused with that message. Nothing here crashes the plugin.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, NoReturn, TypeVar

import structlog

from dra_driver.nvml.fabricmanager import (
    SDK_UNAVAILABLE,
    FabricManager,
    FabricManagerAddress,
    FabricManagerError,
    FabricPartition,
    FmReturn,
    PartitionGpu,
)
from dra_driver.nvml.real.loader import driver_library_dirs
from dra_driver.nvml.types import NvmlError

T = TypeVar("T")
log = structlog.get_logger(__name__)

# nv_fm_types.h
FM_MAX_STR_LENGTH = 256
FM_UUID_BUFFER_SIZE = 80
FM_DEVICE_PCI_BUS_ID_BUFFER_SIZE = 32
FM_MAX_NUM_GPUS = 16
FM_MAX_FABRIC_PARTITIONS = 64
ADDR_TYPE_INET = 1  # NV_FM_API_ADDR_TYPE_INET
ADDR_TYPE_UNIX = 2  # NV_FM_API_ADDR_TYPE_UNIX

# The SDK's library: the versioned soname first, then the development link (NVIDIA's own DRA driver defaults to
# <driver-root>/usr/lib/x86_64-linux-gnu/libnvfm.so).
LIBRARY_NAMES = ("libnvfm.so.1", "libnvfm.so")
ENTRY_POINTS = (
    "fmLibInit",
    "fmLibShutdown",
    "fmConnect",
    "fmDisconnect",
    "fmGetSupportedFabricPartitions",
    "fmActivateFabricPartition",
    "fmDeactivateFabricPartition",
    "fmSetActivatedFabricPartitions",
)


class ConnectParams(ctypes.Structure):
    """fmConnectParams_v2."""

    _fields_ = [
        ("version", ctypes.c_uint),
        ("addressInfo", ctypes.c_char * FM_MAX_STR_LENGTH),
        ("timeoutMs", ctypes.c_uint),
        ("addressIsUnixSocket", ctypes.c_uint),  # deprecated by addressType, still filled as the header describes
        ("addressType", ctypes.c_int),  # enum nvFmApiAddrTypes
    ]


class PartitionGpuInfo(ctypes.Structure):
    """fmFabricPartitionGpuInfo_t; the strings as raw bytes, so a missing NUL can be seen."""

    _fields_ = [
        ("physicalId", ctypes.c_uint),
        ("uuid", ctypes.c_ubyte * FM_UUID_BUFFER_SIZE),
        ("pciBusId", ctypes.c_ubyte * FM_DEVICE_PCI_BUS_ID_BUFFER_SIZE),
        ("numNvLinksAvailable", ctypes.c_uint),
        ("maxNumNvLinks", ctypes.c_uint),
        ("nvlinkLineRateMBps", ctypes.c_uint),
    ]


class PartitionInfo(ctypes.Structure):
    """fmFabricPartitionInfo_t."""

    _fields_ = [
        ("partitionId", ctypes.c_uint),
        ("isActive", ctypes.c_uint),
        ("numGpus", ctypes.c_uint),
        ("gpuInfo", PartitionGpuInfo * FM_MAX_NUM_GPUS),
    ]


class PartitionList(ctypes.Structure):
    """fmFabricPartitionList_v2."""

    _fields_ = [
        ("version", ctypes.c_uint),
        ("numPartitions", ctypes.c_uint),
        ("maxNumPartitions", ctypes.c_uint),
        ("partitionInfo", PartitionInfo * FM_MAX_FABRIC_PARTITIONS),
    ]


class ActivatedList(ctypes.Structure):
    """fmActivatedFabricPartitionList_v1."""

    _fields_ = [
        ("version", ctypes.c_uint),
        ("numPartitions", ctypes.c_uint),
        ("partitionIds", ctypes.c_uint * FM_MAX_FABRIC_PARTITIONS),
    ]


def struct_version(struct: type[ctypes.Structure], version: int) -> int:
    """MAKE_FM_PARAM_VERSION(typeName, ver): the struct's size in the low bytes, its version in the top one."""
    return ctypes.sizeof(struct) | (version << 24)


CONNECT_PARAMS_VERSION = struct_version(ConnectParams, 2)
PARTITION_LIST_VERSION = struct_version(PartitionList, 1)
ACTIVATED_LIST_VERSION = struct_version(ActivatedList, 1)

# What each code means, in the FM user guide's words for the partition calls ("Partition Life Cycle Errors").
MEANINGS: dict[FmReturn, str] = {
    FmReturn.BADPARAM: "an invalid argument or an unknown partition id",
    FmReturn.GENERIC_ERROR: "an unspecified error in Fabric Manager (its log has the detail)",
    FmReturn.NOT_SUPPORTED: "not supported: Fabric Manager is not in shared NVSwitch mode (FABRIC_MODE=1)",
    FmReturn.UNINITIALIZED: "not initialised, or (deactivating) the partition is not active",
    FmReturn.TIMEOUT: "a GPU or NVSwitch configuration step timed out",
    FmReturn.VERSION_MISMATCH: "the SDK library and the running Fabric Manager are of different versions",
    FmReturn.IN_USE: "the partition is already active, or one of its GPUs is in another active partition",
    FmReturn.NOT_CONFIGURED: "Fabric Manager is still initialising",
    FmReturn.CONNECTION_NOT_VALID: "the connection to Fabric Manager is not valid (did it exit?)",
    FmReturn.NVLINK_ERROR: "an NVLink error",
    FmReturn.NOT_READY: "Fabric Manager is not ready to serve requests",
}


def _fm_error(call: str, code: int) -> FabricManagerError:
    try:
        known = FmReturn(code)
    except ValueError:
        return FabricManagerError(FmReturn.GENERIC_ERROR, f"{call} returned {code}, a code this driver does not know")
    meaning = MEANINGS.get(known, known.name.lower().replace("_", " "))
    return FabricManagerError(known, f"{call} failed: {meaning}")


class NvfmClient:
    """`FabricManager` over libnvfm. `driver_root`/`machine` say where the library is looked for when no path is
    given; `load_library` is the seam tests replace (ctypes.CDLL)."""

    def __init__(
        self,
        address: FabricManagerAddress,
        *,
        driver_root: str | None = None,
        machine: str = "x86_64",
        load_library: Callable[[str], Any] = ctypes.CDLL,
    ) -> None:
        self.address = address
        self._driver_root = driver_root
        self._machine = machine
        self._load_library = load_library
        self._lock = threading.Lock()
        self._library: Any = None
        self._problem = ""  # why the last listing failed ("": it did not)

    # --- the FabricManager protocol --------------------------------------------------------------
    def supported_partitions(self) -> tuple[FabricPartition, ...]:
        """FM's partitions. A failure here means no partition is offered, so it is logged (once until it changes)."""

        def call(lib: Any, handle: ctypes.c_void_p) -> tuple[FabricPartition, ...]:
            listed = PartitionList()
            listed.version = PARTITION_LIST_VERSION
            code = lib.fmGetSupportedFabricPartitions(handle, ctypes.byref(listed))
            self._check("fmGetSupportedFabricPartitions", code)
            return parse_partitions(listed)

        try:
            listed = self._session(call)
        except FabricManagerError as exc:
            self._listing_failed(str(exc))
            raise
        self._listing_failed("")
        return listed

    def _listing_failed(self, problem: str) -> None:
        """Discovery lists the partitions every rediscovery: say so when it starts or stops failing, not each time."""
        with self._lock:
            before, self._problem = self._problem, problem
        if problem and problem != before:
            log.warning("Fabric Manager's partitions cannot be listed; none is offered", error=problem)
        elif before and not problem:
            log.info("Fabric Manager's partitions are listed again", address=self.address.describe())

    def activate(self, partition_id: int) -> None:
        pid = _partition_id(partition_id)
        self._session(
            lambda lib, h: self._check(f"fmActivateFabricPartition({pid})", lib.fmActivateFabricPartition(h, pid))
        )

    def deactivate(self, partition_id: int) -> None:
        pid = _partition_id(partition_id)
        self._session(
            lambda lib, h: self._check(f"fmDeactivateFabricPartition({pid})", lib.fmDeactivateFabricPartition(h, pid))
        )

    def set_activated(self, partition_ids: tuple[int, ...]) -> None:
        ids = [_partition_id(p) for p in partition_ids]
        if len(ids) > FM_MAX_FABRIC_PARTITIONS or len(set(ids)) != len(ids):
            raise FabricManagerError(
                FmReturn.BADPARAM, f"activated partition list {ids}: at most {FM_MAX_FABRIC_PARTITIONS} distinct ids"
            )
        activated = ActivatedList()
        activated.version = ACTIVATED_LIST_VERSION
        activated.numPartitions = len(ids)
        for i, pid in enumerate(ids):
            activated.partitionIds[i] = pid
        self._session(
            lambda lib, h: self._check(
                f"fmSetActivatedFabricPartitions({ids})", lib.fmSetActivatedFabricPartitions(h, ctypes.byref(activated))
            )
        )

    # --- one session per call ----------------------------------------------------------------------
    def _session(self, call: Callable[[Any, ctypes.c_void_p], T]) -> T:
        with self._lock:
            lib = self._open()
            initialised = lib.fmLibInit()
            if initialised not in (FmReturn.SUCCESS, FmReturn.IN_USE):  # IN_USE: already initialised in-process
                raise self._unavailable(f"fmLibInit returned {_code_name(initialised)}")
            try:
                handle = ctypes.c_void_p()
                params = self._connect_params()
                connected = lib.fmConnect(ctypes.byref(params), ctypes.byref(handle))
                if connected != FmReturn.SUCCESS:
                    raise FabricManagerError(
                        _known(connected),
                        SDK_UNAVAILABLE.format(
                            why=f"Fabric Manager did not answer at {self.address.describe()} (fmConnect returned "
                            f"{_code_name(connected)}); check that nvidia-fabricmanager runs with FABRIC_MODE=1 and "
                            "listens there (FM_CMD_UNIX_SOCKET_PATH, or FM_CMD_BIND_INTERFACE and FM_CMD_PORT_NUMBER "
                            "with --fabric-manager-address)"
                        ),
                    )
                try:
                    return call(lib, handle)
                finally:
                    lib.fmDisconnect(handle)
            finally:
                if initialised == FmReturn.SUCCESS:
                    lib.fmLibShutdown()

    def _connect_params(self) -> ConnectParams:
        params = ConnectParams()
        params.version = CONNECT_PARAMS_VERSION
        params.timeoutMs = self.address.timeout_ms
        if self.address.tcp:
            params.addressInfo = self.address.tcp_address().encode()
            params.addressType = ADDR_TYPE_INET
        else:
            params.addressInfo = self.address.unix_socket.encode()
            params.addressIsUnixSocket = 1
            params.addressType = ADDR_TYPE_UNIX
        return params

    @staticmethod
    def _check(call: str, code: int) -> None:
        if code != FmReturn.SUCCESS:
            raise _fm_error(call, code)

    def _open(self) -> Any:
        """The library, loaded once (a loaded library is never unloaded by ctypes anyway), its entry points typed."""
        if self._library is not None:
            return self._library
        tried: list[str] = []
        for candidate in self._candidates():
            try:
                lib = self._load_library(candidate)
            except OSError as exc:
                tried.append(f"{candidate}: {exc}")
                continue
            missing = [name for name in ENTRY_POINTS if not hasattr(lib, name)]
            if missing:
                raise self._unavailable(
                    f"{candidate} lacks {', '.join(missing)} (not NVIDIA's libnvfm, or one too old for shared "
                    "NVSwitch partitions)"
                )
            _declare(lib)
            self._library = lib
            return lib
        raise self._unavailable(
            f"libnvfm could not be loaded ({'; '.join(tried)}); install the Fabric Manager SDK "
            "(nvidia-fabricmanager-dev) on the node or set --fabric-manager-library to its libnvfm.so"
        )

    def _candidates(self) -> list[str]:
        if self.address.library:
            return [self.address.library]
        found: list[str] = []
        if self._driver_root not in (None, "", "/"):
            for directory in driver_library_dirs(str(self._driver_root), self._machine):
                found += [
                    os.path.join(directory, n) for n in LIBRARY_NAMES if os.path.isfile(os.path.join(directory, n))
                ]
        return [*found, *LIBRARY_NAMES]  # then the dynamic loader's search

    def _unavailable(self, why: str) -> FabricManagerError:
        return FabricManagerError(FmReturn.NOT_SUPPORTED, SDK_UNAVAILABLE.format(why=why))


def _declare(lib: Any) -> None:
    handle = ctypes.c_void_p
    signatures: dict[str, Sequence[Any]] = {
        "fmLibInit": [],
        "fmLibShutdown": [],
        "fmConnect": [ctypes.POINTER(ConnectParams), ctypes.POINTER(ctypes.c_void_p)],
        "fmDisconnect": [handle],
        "fmGetSupportedFabricPartitions": [handle, ctypes.POINTER(PartitionList)],
        "fmActivateFabricPartition": [handle, ctypes.c_uint],
        "fmDeactivateFabricPartition": [handle, ctypes.c_uint],
        "fmSetActivatedFabricPartitions": [handle, ctypes.POINTER(ActivatedList)],
    }
    for name, argtypes in signatures.items():
        function = getattr(lib, name)
        function.argtypes = list(argtypes)
        function.restype = ctypes.c_int


def _partition_id(value: int) -> int:
    if not 0 <= value < 2**32:
        raise FabricManagerError(FmReturn.BADPARAM, f"partition id {value} is not an fmFabricPartitionId_t")
    return value


def _known(code: int) -> FmReturn:
    try:
        return FmReturn(code)
    except ValueError:
        return FmReturn.GENERIC_ERROR


def _code_name(code: int) -> str:
    try:
        return f"FM_ST_{FmReturn(code).name}"
    except ValueError:
        return str(code)


class _WithModuleIds:
    """A FabricManager whose listed members carry a UUID and bus id even where FM leaves them empty (H100 and later
    boards report only the physical id, the GPU's module id): they are filled from `gpus`, module id → (UUID, bus
    id), asked only when a member lacks them. A member it cannot name keeps its empty UUID (the offer then leaves
    its partition out: inventory/fmpartitions.py offers partitions of known GPUs only)."""

    def __init__(self, client: FabricManager, gpus: Callable[[], Mapping[int, tuple[str, str]]]) -> None:
        self._client = client
        self._gpus = gpus

    def supported_partitions(self) -> tuple[FabricPartition, ...]:
        listed = self._client.supported_partitions()
        if all(g.uuid for p in listed for g in p.gpus):
            return listed
        try:
            known = self._gpus()
        except NvmlError:
            return listed
        return tuple(replace(p, gpus=tuple(_named(g, known) for g in p.gpus)) for p in listed)

    def activate(self, partition_id: int) -> None:
        self._client.activate(partition_id)

    def deactivate(self, partition_id: int) -> None:
        self._client.deactivate(partition_id)

    def set_activated(self, partition_ids: tuple[int, ...]) -> None:
        self._client.set_activated(partition_ids)


def with_module_ids(client: FabricManager, gpus: Callable[[], Mapping[int, tuple[str, str]]]) -> FabricManager:
    return _WithModuleIds(client, gpus)


def _named(gpu: PartitionGpu, known: Mapping[int, tuple[str, str]]) -> PartitionGpu:
    if gpu.uuid or gpu.physical_id not in known:
        return gpu
    uuid, bus_id = known[gpu.physical_id]
    return replace(gpu, uuid=uuid, pci_bus_id=gpu.pci_bus_id or bus_id)


# --- what FM answered, checked --------------------------------------------------------------------------------------
def parse_partitions(listed: PartitionList) -> tuple[FabricPartition, ...]:
    """The partitions of an fmFabricPartitionList_v2 FM filled; raises FabricManagerError on anything out of bounds."""
    count = listed.numPartitions
    if count > FM_MAX_FABRIC_PARTITIONS:
        _invalid(f"numPartitions is {count}, above FM_MAX_FABRIC_PARTITIONS ({FM_MAX_FABRIC_PARTITIONS})")
    out: list[FabricPartition] = []
    for i in range(count):
        info = listed.partitionInfo[i]
        where = f"partitionInfo[{i}] (partition {info.partitionId})"
        if not 0 < info.numGpus <= FM_MAX_NUM_GPUS:
            _invalid(f"{where}.numGpus is {info.numGpus}, not 1 to FM_MAX_NUM_GPUS ({FM_MAX_NUM_GPUS})")
        if info.isActive not in (0, 1):
            _invalid(f"{where}.isActive is {info.isActive}, not 0 or 1")
        gpus = tuple(_gpu(info.gpuInfo[j], f"{where}.gpuInfo[{j}]") for j in range(info.numGpus))
        if len({g.physical_id for g in gpus}) != len(gpus):
            _invalid(f"{where} names a GPU physical id twice")
        out.append(FabricPartition(info.partitionId, bool(info.isActive), gpus))
    ids = [p.id for p in out]
    if len(set(ids)) != len(ids):
        _invalid(f"partition ids {ids} are not unique")
    return tuple(out)


def _gpu(info: PartitionGpuInfo, where: str) -> PartitionGpu:
    uuid = _string(bytes(info.uuid), f"{where}.uuid")
    bus_id = _string(bytes(info.pciBusId), f"{where}.pciBusId")
    return PartitionGpu(info.physicalId, uuid, bus_id, info.numNvLinksAvailable)


def _string(raw: bytes, where: str) -> str:
    """A NUL-terminated printable ASCII string; FM leaves uuid and pciBusId empty on H100 and later boards."""
    end = raw.find(b"\0")
    if end < 0:
        _invalid(f"{where} has no terminating NUL in its {len(raw)} bytes")
    text = raw[:end]
    if any(not 0x20 < b < 0x7F for b in text):
        _invalid(f"{where} {text!r} is not printable ASCII")
    return text.decode("ascii")


def _invalid(detail: str) -> NoReturn:
    raise FabricManagerError(
        FmReturn.GENERIC_ERROR, f"Fabric Manager answered an invalid partition list: {detail}; nothing of it is used"
    )
