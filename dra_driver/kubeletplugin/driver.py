"""What a DRA driver plugs into the kubelet-plugin layer, and the values that cross between them.

A driver implements `Driver` (prepare and unprepare a batch of claims, one result per claim; failures are results,
never exceptions) and, if it reports device health, a `HealthSource` (the layer streams it to the kubelet). The layer
does the rest: sockets, registration, both DRA API versions, refusing claim identities Kubernetes could not have
sent. Nothing here knows what a device is beyond its pool and name (and, for KEP-5304 device metadata, the
attributes the driver hands over in the ResourceSlice's JSON form, which the layer writes without reading them).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class ClaimRef:
    """A ResourceClaim as the kubelet names it in its calls: namespace, name and UID."""

    namespace: str
    name: str
    uid: str


@dataclass(frozen=True)
class NetworkDeviceData:
    """resource.k8s.io/v1 NetworkDeviceData: what a network device got once its pod's network exists."""

    interface_name: str = ""
    ips: tuple[str, ...] = ()
    hardware_address: str = ""


@dataclass(frozen=True)
class DeviceMetadata:
    """What a workload may read about one prepared device (KEP-5304, docs/kubelet-plugin.md "Device metadata").

    `attributes` are in the JSON form of ResourceSlice attributes (`{"uuid": {"string": "GPU-..."}}`; unqualified
    names belong to the driver's domain), as published plus what only prepare knows. `request_refs` are the
    allocation results' request names with the subrequest (`"gpu/big"`); empty: the device's `request_names`."""

    attributes: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    request_refs: tuple[str, ...] = ()
    network_data: NetworkDeviceData | None = None


@dataclass(frozen=True)
class DeviceResult:
    """One prepared device in a claim's answer to the kubelet: the requests it serves and its CDI device ids."""

    request_names: tuple[str, ...]
    pool: str
    device: str
    cdi_device_ids: tuple[str, ...]
    share_id: str | None = None
    metadata: DeviceMetadata | None = None  # None: the device has no metadata of its own (it is still listed)


@dataclass(frozen=True)
class PrepareResult:
    """A claim's outcome of NodePrepareResources: its prepared devices, or the error the kubelet reports."""

    devices: tuple[DeviceResult, ...] = ()
    error: str = ""
    # Things the user should know about a prepare that succeeded (e.g. a config with nothing to apply on a device):
    # recorded as Normal Events on the claim, never sent to the kubelet.
    notes: tuple[str, ...] = ()
    # The claim's `resource.kubernetes.io/pod-claim-name` annotation (set on claims made from a template; None when
    # absent): where device metadata appears in the container.
    pod_claim_name: str | None = None
    # The driver's record of the claim as its engine wrote or found it (the prepare pipeline's observers read it
    # instead of the checkpoint: pipeline.py); None where nothing was prepared. Never sent to the kubelet, and no part
    # of what makes two answers equal (an answer is its devices, error and notes).
    record: object | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class DeviceHealth:
    """One device's health as the kubelet's health stream (DRAResourceHealth) reports it."""

    pool: str
    device: str
    healthy: bool | None  # None: unknown
    last_updated: int  # unix seconds
    message: str = ""


@dataclass(frozen=True)
class HealthSnapshot:
    """Every device's health at one version of the board; a new version is sent on the health stream."""

    version: int
    devices: tuple[DeviceHealth, ...] = field(default_factory=tuple)


class Driver(Protocol):
    """The driver side of NodePrepareResources / NodeUnprepareResources (both API versions). Claims reach it with
    valid identities only, each UID once; it is called from many gRPC threads at once."""

    def prepare(self, claims: list[ClaimRef]) -> dict[str, PrepareResult]:
        """One entry per claim UID; failures are in PrepareResult.error, never raised."""

    def unprepare(self, claims: list[ClaimRef]) -> dict[str, str]:
        """One entry per claim UID: "" on success, else the error."""


class HealthSource(Protocol):
    def snapshot(self) -> HealthSnapshot: ...

    def wait_for_change(self, after_version: int, timeout: float) -> HealthSnapshot:
        """Block until the snapshot version differs from `after_version` or the timeout passes."""
