"""What a DRA driver plugs into the kubelet-plugin layer, and the values that cross between them.

A driver implements `Driver` (prepare and unprepare a batch of claims, one result per claim; failures are results,
never exceptions) and, if it reports device health, a `HealthSource` (the layer streams it to the kubelet). The layer
does the rest: sockets, registration, both DRA API versions, refusing claim identities Kubernetes could not have
sent. Nothing here knows what a device is beyond its pool and name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class ClaimRef:
    namespace: str
    name: str
    uid: str


@dataclass(frozen=True)
class DeviceResult:
    request_names: tuple[str, ...]
    pool: str
    device: str
    cdi_device_ids: tuple[str, ...]
    share_id: str | None = None


@dataclass(frozen=True)
class PrepareResult:
    devices: tuple[DeviceResult, ...] = ()
    error: str = ""
    # Things the user should know about a prepare that succeeded (e.g. a config with nothing to apply on a device):
    # recorded as Normal Events on the claim, never sent to the kubelet.
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class DeviceHealth:
    pool: str
    device: str
    healthy: bool | None  # None: unknown
    last_updated: int  # unix seconds
    message: str = ""


@dataclass(frozen=True)
class HealthSnapshot:
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
