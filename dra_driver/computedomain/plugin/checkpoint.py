"""The compute-domain plugin's device records and claim details in its checkpoint (`<plugin-dir>/checkpoint.json`,
its own namespace: another plugin dir than the GPU driver's). The claim record, the file format and the store are
the kubelet-plugin layer's (`dra_driver/kubeletplugin/claimrecord.py`, `checkpoint.py`).

A claim record: the layer's (namespace, name, state, the fingerprint of the allocation it was prepared for, when it
was aborted), its details (the domain it serves: uid, namespace, name; the node's clique), and one entry per device
(request names, device, kind, CDI ids, channels). States:

    PrepareStarted     prepare began changing the node (node label, daemon dir); a crash rolls it back
    PrepareCompleted   prepared; the kubelet holds the CDI ids
    UnprepareStarted   unprepare began; a crash finishes it (never "repairs" it back)
    PrepareAborted     an unprepare came while the claim was still PrepareStarted (NVIDIA #1162): what it had done
                       is undone and the record kept for ABORTED_TTL_S, so that a stale prepare retry of the same
                       allocation arriving later is refused instead of preparing a claim the kubelet let go

Decoding is lenient where it can be (unknown fields ignored, missing ones defaulted, an unknown state read as
PrepareStarted so it is rolled back); a damaged file or an unknown device kind raises CorruptCheckpointError (the
store moves it aside).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dra_driver.kubeletplugin import claimrecord
from dra_driver.kubeletplugin.checkpoint import CorruptCheckpointError
from dra_driver.kubeletplugin.claimrecord import ClaimState

__all__ = ["ABORTED_TTL_S", "CHECKPOINT_NAME", "Checkpoint", "ClaimRecord", "ClaimState"]

CHECKPOINT_NAME = "checkpoint.json"
ABORTED_TTL_S = 600.0  # how long a PrepareAborted record refuses stale prepares (NVIDIA's cleanup period)


class DomainDeviceKind(enum.StrEnum):
    CHANNEL = "channel"
    DAEMON = "daemon"


@dataclass(frozen=True)
class DomainDevice:
    """A prepared device of this driver (a `claimrecord.DeviceRecord`)."""

    request_names: tuple[str, ...]
    pool: str
    device: str  # channel-0 | daemon-0
    kind: DomainDeviceKind
    cdi_device_ids: tuple[str, ...] = ()
    channels: tuple[int, ...] = ()  # a channel device: the IMEX channels injected (0, or 0..2047 in All mode)


@dataclass(frozen=True)
class DomainClaim:
    """The claim record's details: the ComputeDomain the claim serves and the node's clique when prepared."""

    domain_uid: str = ""
    domain_namespace: str = ""
    domain_name: str = ""
    clique_id: str = ""  # "" without one


# This driver's claim record and checkpoint: the layer's (kubeletplugin/claimrecord.py) with its devices and details.
ClaimRecord = claimrecord.ClaimRecord[DomainDevice, DomainClaim]
Checkpoint = claimrecord.Checkpoint[DomainDevice, DomainClaim]


def domain_of(record: ClaimRecord) -> DomainClaim:
    return record.details if record.details is not None else DomainClaim()


def holds(record: ClaimRecord, kind: DomainDeviceKind) -> bool:
    return any(d.kind is kind for d in record.devices)


class DomainRecordFormat:
    """How this driver's device records and claim details are written (`claimrecord.RecordFormat`)."""

    states = frozenset(ClaimState)

    def encode_device(self, d: DomainDevice) -> dict[str, Any]:
        out: dict[str, Any] = {"requestNames": list(d.request_names), "pool": d.pool, "device": d.device,
                               "kind": d.kind.value, "cdiDeviceIds": list(d.cdi_device_ids)}
        if d.channels:
            out["channels"] = _channels_json(d.channels)
        return out

    def decode_device(self, raw: Mapping[str, Any]) -> DomainDevice:
        return DomainDevice(
            request_names=_strs(raw.get("requestNames")), pool=str(raw.get("pool", "")),
            device=str(raw.get("device", "")), kind=_kind(raw.get("kind")),
            cdi_device_ids=_strs(raw.get("cdiDeviceIds")), channels=_channels(raw.get("channels")),
        )

    def encode_details(self, details: DomainClaim) -> dict[str, Any]:
        return {"domain": {"uid": details.domain_uid, "namespace": details.domain_namespace,
                           "name": details.domain_name},
                "cliqueID": details.clique_id}

    def decode_details(self, raw: Mapping[str, Any]) -> DomainClaim:
        found = raw.get("domain")
        domain: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
        return DomainClaim(domain_uid=str(domain.get("uid", "")), domain_namespace=str(domain.get("namespace", "")),
                           domain_name=str(domain.get("name", "")), clique_id=str(raw.get("cliqueID", "")))


DOMAIN_RECORDS = DomainRecordFormat()


def _channels_json(channels: tuple[int, ...]) -> Any:
    # All mode is 2048 channels: written as a range, not 2048 numbers.
    if len(channels) > 1 and channels == tuple(range(channels[0], channels[-1] + 1)):
        return {"first": channels[0], "last": channels[-1]}
    return list(channels)


def _strs(value: Any) -> tuple[str, ...]:
    return tuple(str(v) for v in value) if isinstance(value, list) else ()


def _channels(value: Any) -> tuple[int, ...]:
    if isinstance(value, dict):
        return tuple(range(int(value["first"]), int(value["last"]) + 1))
    return tuple(int(v) for v in value) if isinstance(value, list) else ()


def _kind(value: Any) -> DomainDeviceKind:
    try:
        return DomainDeviceKind(value)
    except ValueError:
        raise CorruptCheckpointError(f"unknown device kind {value!r}") from None
