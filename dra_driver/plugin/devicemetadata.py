"""What the GPU driver tells a workload about each prepared device (KEP-5304 device metadata).

The kubelet-plugin layer writes the metadata file and its CDI mount (`kubeletplugin/metadata.py`); this module
supplies the content: for every prepared device of this driver (whole GPU, MIG device, share, passthrough
device) the attributes its ResourceSlice publishes (`slices/attributes.py`, from the device catalog), plus what
only prepare knows: a dynamic MIG device's live UUID (its catalog entry has none before it is carved). So
`resource.kubernetes.io/pciBusID`, which KubeVirt's virt-launcher reads for a VM's `<hostdev>`, is in every
device's file, and a device kind that adds attributes to its slice entry gets them here with no change.

`MetadataAttributes` is an observer on the prepare pipeline (plugin/claimpipeline.py): it describes each device from
the record the engine's answer carries, so a repeated prepare (no claim read) returns the same, with no checkpoint
read of its own.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

import structlog

from dra_driver.inventory.catalog import AllocatableDevice
from dra_driver.kubeletplugin.driver import DeviceMetadata, PrepareResult
from dra_driver.kubeletplugin.pipeline import PrepareOutcome, UnprepareOutcome
from dra_driver.nvml.types import SystemInfo
from dra_driver.plugin.checkpoint import ClaimRecord, PreparedDevice
from dra_driver.slices.attributes import STANDARD_PCI_BUS_ID, device_attributes


class DeviceMetadataMode(enum.StrEnum):
    """`--device-metadata`: `auto` writes it where the API server is 1.36 or newer (KEP-5304 alpha; beta in 1.37)."""

    AUTO = "auto"
    ON = "on"
    OFF = "off"


FIRST_VERSION = (1, 36)

log = structlog.get_logger(__name__)


def metadata_enabled(mode: DeviceMetadataMode, kube_version: tuple[int, int] | None) -> bool:
    """Whether device metadata is written. `kube_version` None: not known (no API server asked, or it did not
    answer): `auto` stays off rather than mount files into containers of a cluster that predates the KEP."""
    if mode is DeviceMetadataMode.AUTO:
        return kube_version is not None and kube_version >= FIRST_VERSION
    return mode is DeviceMetadataMode.ON


def prepared_attributes(
    record: PreparedDevice,
    device: AllocatableDevice | None,
    system: SystemInfo | None,
    *,
    list_attributes: bool = False,
) -> dict[str, Mapping[str, Any]]:
    """The slice's attributes of the device, with the live identities of its record over them."""
    attrs: dict[str, Mapping[str, Any]] = {}
    if device is not None and system is not None:
        attrs.update(device_attributes(device, system, list_attributes))
    if record.mig is not None and record.mig.uuid:
        attrs["uuid"] = {"string": record.mig.uuid}
        attrs.setdefault("parentUUID", {"string": record.mig.parent_uuid})
    elif "uuid" not in attrs and record.gpu_uuid:
        attrs["uuid"] = {"string": record.gpu_uuid}
    if record.vgpu is not None and record.vgpu.vf is not None:
        attrs[STANDARD_PCI_BUS_ID] = {"string": record.vgpu.vf}  # the vGPU's VF: what KubeVirt hands the VM
    if record.vgpu is not None and record.vgpu.mdev is not None:
        attrs["mdevUUID"] = {"string": record.vgpu.mdev}  # a mediated device: KubeVirt's <hostdev type='mdev'>
    return attrs


def describe(
    result: PrepareResult,
    record: ClaimRecord,
    catalog: Mapping[str, AllocatableDevice],
    system: SystemInfo | None,
    *,
    list_attributes: bool = False,
) -> PrepareResult:
    """`result` with each device's metadata and the claim's pod claim name, from its checkpoint record."""
    by_key = {(d.pool, d.device, d.share_id): d for d in record.devices}
    devices = []
    for device in result.devices:
        prepared = by_key.get((device.pool, device.device, device.share_id))
        if prepared is None:
            devices.append(device)
            continue
        metadata = DeviceMetadata(
            attributes=prepared_attributes(prepared, catalog.get(device.device), system,
                                           list_attributes=list_attributes),
            request_refs=(prepared.request_ref,) if prepared.request_ref else (),
        )  # fmt: skip
        devices.append(replace(device, metadata=metadata))
    return replace(result, devices=tuple(devices), pod_claim_name=record.pod_claim_name)


@dataclass(frozen=True, kw_only=True)
class MetadataAttributes:
    """The prepare pipeline's observer that adds to each prepared device what `describe` says, from the record the
    engine's answer carries (run only while metadata is written; before `MetadataFiles` writes it)."""

    catalog: Callable[[], Mapping[str, AllocatableDevice]]
    system: Callable[[], SystemInfo | None]
    list_attributes: Callable[[], bool]
    enabled: Callable[[], bool] = lambda: True

    def prepared(self, outcomes: Sequence[PrepareOutcome]) -> dict[str, PrepareResult]:
        if not self.enabled():
            return {}
        described: dict[str, PrepareResult] = {}
        for ref, result in ((o.ref, o.result) for o in outcomes if not o.result.error and o.result.devices):
            record = cast("ClaimRecord | None", result.record)  # the GPU engine's answers carry its ClaimRecord
            if record is None:
                continue
            try:
                described[ref.uid] = describe(
                    result, record, self.catalog(), self.system(), list_attributes=self.list_attributes()
                )
            except Exception as exc:  # this claim's metadata would be wrong: its error, the other claims answered
                log.exception("describing the prepared devices for device metadata failed",
                              claim=f"{ref.namespace}/{ref.name}", claim_uid=ref.uid)  # fmt: skip
                described[ref.uid] = PrepareResult(
                    error=f"prepare {ref.namespace}/{ref.name}: device metadata: describing the devices failed: {exc}"
                )
        return described

    def unprepared(self, outcomes: Sequence[UnprepareOutcome]) -> dict[str, str]:
        return {}
