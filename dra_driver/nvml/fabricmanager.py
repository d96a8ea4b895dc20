"""NVIDIA Fabric Manager's shared-NVSwitch partitions (docs/passthrough.md "Fabric Manager partitions"): the
model of the FM SDK's answers (`fmGetSupportedFabricPartitions`, `fmActivateFabricPartition`,
`fmDeactivateFabricPartition`, `fmSetActivatedFabricPartitions`; return codes `fmReturn_t` of `nv_fm_types.h`), the
`FabricManager` protocol the plugin drives, where the plugin finds Fabric Manager (`FabricManagerAddress`, from the
`--fabric-manager-*` flags), and what it gets where no Fabric Manager SDK is reachable.

Two answer it: the fake node's FM (nvml/fake/fmpartitions.py) and, on a real node, the client of NVIDIA's FM SDK
library libnvfm (nvml/real/fabricmanager.py). Where neither can be had (`--fabric-partitions` off, the library
missing, FM not answering) every call is refused with a FabricManagerError that says "Fabric Manager SDK not
available: <why>" (`UnavailableFabricManager`, or the client's own refusal), never a silent success.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol


class FmReturn(enum.IntEnum):
    """`fmReturn_t` (nv_fm_types.h): 0 success, negative errors (-11 … -29 are the later SDKs' additions)."""

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
    RESOURCE_BAD = -11
    RESOURCE_IN_USE = -12
    RESOURCE_NOT_IN_USE = -13
    RESOURCE_EXHAUSTED = -14
    RESOURCE_NOT_READY = -15
    PARTITION_EXISTS = -16
    PARTITION_ID_IN_USE = -17
    PARTITION_ID_NOT_IN_USE = -18
    PARTITION_NAME_IN_USE = -19
    PARTITION_NAME_NOT_IN_USE = -20
    PARTITION_ID_NAME_MISMATCH = -21
    NOT_READY = -22
    RESOURCE_USED_IN_THIS_PARTITION = -23
    RESOURCE_USED_IN_ANOTHER_PARTITION = -24
    PARTITION_MISWIRED_TRUNKS = -25
    PARTITION_INSUFFICIENT_TRUNKS = -26
    PARTITION_MISSING_SWITCHES = -27
    PARTITION_NETWORK_CONFIG_ERROR = -28
    PARTITION_ROUTE_PROGRAMMING_ERROR = -29


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


SDK_UNAVAILABLE = "Fabric Manager SDK not available: {why}"
NOT_CONFIGURED = "--fabric-partitions is off (no Fabric Manager is asked)"

# FM's own default TCP port (FM_CMD_PORT_NUMBER), used where `--fabric-manager-address` names none.
FM_CMD_PORT = 6666
DEFAULT_UNIX_SOCKET = "/run/nvidia-fabricmanager/socket"
DEFAULT_CONNECT_TIMEOUT_MS = 5000
# fmConnectParams_t.addressInfo is char[256], NUL included.
MAX_ADDRESS_BYTES = 255


@dataclass(frozen=True)
class FabricManagerAddress:
    """Where the plugin finds FM's SDK library and FM itself (`--fabric-manager-library`, `--fabric-manager-socket`,
    `--fabric-manager-address`). `tcp` set: FM's TCP command port `<ipv4>[:port]` (FM_CMD_BIND_INTERFACE /
    FM_CMD_PORT_NUMBER); else the UNIX socket `unix_socket` (FM_CMD_UNIX_SOCKET_PATH). `library` "" : libnvfm is
    looked for under the driver root, then by the dynamic loader."""

    library: str = ""
    unix_socket: str = DEFAULT_UNIX_SOCKET
    tcp: str = ""
    timeout_ms: int = DEFAULT_CONNECT_TIMEOUT_MS

    def __post_init__(self) -> None:
        if self.library and not self.library.startswith("/"):
            raise ValueError(
                f"--fabric-manager-library {self.library!r}: give an absolute path to libnvfm.so (or leave it empty "
                "to search the driver root)"
            )
        if self.tcp:
            _check_inet(self.tcp)
        elif not self.unix_socket.startswith("/") or len(self.unix_socket.encode()) > MAX_ADDRESS_BYTES:
            raise ValueError(
                f"--fabric-manager-socket {self.unix_socket!r}: give the absolute path of FM's UNIX socket "
                f"(FM_CMD_UNIX_SOCKET_PATH in its config), at most {MAX_ADDRESS_BYTES} bytes"
            )
        if not 0 < self.timeout_ms < 2**31:
            raise ValueError(f"Fabric Manager connect timeout {self.timeout_ms} ms: give a positive number")

    def describe(self) -> str:
        return f"TCP {self.tcp_address()}" if self.tcp else f"UNIX socket {self.unix_socket}"

    def tcp_address(self) -> str:
        """`<ipv4>:<port>`, FM's default port added where none is given."""
        return self.tcp if ":" in self.tcp else f"{self.tcp}:{FM_CMD_PORT}"


def _check_inet(text: str) -> None:
    """FM's TCP address is `<ipv4>[:port]` (fmConnectParams_t.addressInfo); anything else is refused naming it."""
    host, _, port = text.partition(":")
    parts = host.split(".")
    ok = len(parts) == 4 and all(p.isdigit() and int(p) < 256 for p in parts)
    if ok and port:
        ok = port.isdigit() and 0 < int(port) < 65536
    if not ok:
        raise ValueError(
            f"--fabric-manager-address {text!r}: give FM's command address as <ipv4>[:port] (FM_CMD_BIND_INTERFACE "
            f"and FM_CMD_PORT_NUMBER in its config; port {FM_CMD_PORT} when left out), e.g. 127.0.0.1:{FM_CMD_PORT}"
        )


class UnavailableFabricManager:
    """What a node gets where no Fabric Manager can be asked: every call refused with NOT_SUPPORTED, saying why
    (never a silent success)."""

    def __init__(self, why: str = NOT_CONFIGURED) -> None:
        self.message = SDK_UNAVAILABLE.format(why=why)

    def supported_partitions(self) -> tuple[FabricPartition, ...]:
        raise FabricManagerError(FmReturn.NOT_SUPPORTED, self.message)

    def activate(self, partition_id: int) -> None:
        raise FabricManagerError(FmReturn.NOT_SUPPORTED, self.message)

    def deactivate(self, partition_id: int) -> None:
        raise FabricManagerError(FmReturn.NOT_SUPPORTED, self.message)

    def set_activated(self, partition_ids: tuple[int, ...]) -> None:
        raise FabricManagerError(FmReturn.NOT_SUPPORTED, self.message)
