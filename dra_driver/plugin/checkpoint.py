"""The GPU driver's device records in the crash-safe checkpoint of which claims this node has prepared.

The claim record, its states, the file's format and its store are the kubelet-plugin layer's
(`dra_driver/kubeletplugin/claimrecord.py`, `checkpoint.py`); this module adds what a GPU device record holds (the
physical GPU, a MIG instance's identity, a time-slice, an MPS daemon, a passthrough's functions, a vGPU's VF) and how
it is written. Optional fields are omitted when unset, so older readers never see surprises; an older plugin's file
(written indented, before the layer's codec) reads unchanged.

A file from before the last reboot is discarded (nothing prepared survives a reboot: MIG instances and /var/run/cdi
are gone). A corrupt file is moved aside under a unique name instead of making the plugin crash-loop, and the store
remembers the loss (`take_loss`): the engine then rebuilds ownership from what exists on the node rather than
treating everything there as unowned.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dra_driver.kubeletplugin import checkpoint as store
from dra_driver.kubeletplugin import claimrecord
from dra_driver.kubeletplugin.claimrecord import ClaimCodec, ClaimState, optional_int, optional_str

__all__ = ["Checkpoint", "ClaimRecord", "ClaimState"]


@dataclass(frozen=True)
class MigRecord:
    """A MIG device this plugin created (dynamic MIG): its spec and, once created, its live identity."""

    parent_uuid: str
    profile_id: int
    placement_start: int
    placement_size: int
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    uuid: str | None = None

    def record_on(self, device: PreparedDevice) -> PreparedDevice:
        """What an effect made, written into its device's record (kubeletplugin/effect.py `Made`)."""
        return replace(device, mig=self)


@dataclass(frozen=True)
class MpsRecord:
    """The MPS control daemon a device is served by, and the limits this device asks of it.

    Recorded in the PrepareStarted record before the daemon is started, so a rollback or the last unprepare stops
    it; the records holding one daemon id are its reference count, and its limits are derived from them."""

    daemon: str  # daemon id: its directory <mps-root>/<daemon>
    active_thread_percentage: int | None = None
    pinned_memory_limit: int | None = None  # bytes
    # A consumable-capacity share: the limits are this share's own (handed to its containers), and the daemon's
    # are the largest of its shares'.
    share: bool = False
    uuid: str | None = None  # what the daemon serves for this device (GPU or MIG UUID), once known
    multi_user: bool = False  # the daemon must serve clients of every UID (-M)


@dataclass(frozen=True)
class VfioFunction:
    """One PCI function a passthrough moved to vfio-pci, and the driver it had (None: it was unbound).
    `persistence_mode`: for another GPU of the IOMMU group, its persistence mode before (restored with it; None for
    the passed-through GPU, whose mode is VfioRecord.persistence_mode, and for functions that are no GPU)."""

    address: str
    driver: str | None
    persistence_mode: bool | None = None


@dataclass(frozen=True)
class VfioRecord:
    """A GPU passed through to a VM (plugin/effects/vfio_passthrough.py).

    Planned with the GPU's address and IOMMU group; `functions` and `persistence_mode` are recorded (durably, in
    the PrepareStarted record) before the first function leaves its driver, so a rollback, an unprepare or the
    recovery after a crash rebinds each to exactly the driver it had and restores persistence mode."""

    address: str  # the GPU's PCI function, e.g. "0000:1b:00.0"
    group: int  # its IOMMU group: /dev/vfio/<group>
    driver: str = "vfio-pci"  # the vfio driver it is bound to (a vfio-pci variant where one matches)
    functions: tuple[VfioFunction, ...] = ()  # empty: nothing moved yet
    persistence_mode: bool | None = None  # the GPU's persistence mode before (None: not read yet)
    iommufd: bool = False  # PreferIommuFD on a host with /dev/iommu: the VM gets /dev/vfio/devices/<vfio_dev>
    api_device: bool = False  # enableAPIDevice: also /dev/vfio/vfio (or /dev/iommu)
    vfio_dev: str | None = None  # "vfio3", known once bound (IOMMUFD)

    @property
    def started(self) -> bool:
        return bool(self.functions)

    def record_on(self, device: PreparedDevice) -> PreparedDevice:
        """What an effect made, written into its device's record (kubeletplugin/effect.py `Made`)."""
        return replace(device, vfio=self)


@dataclass(frozen=True)
class VgpuRecord:
    """A vGPU this plugin creates on one of its GPU's SR-IOV virtual functions (plugin/effects/vgpu.py).

    Planned with the GPU's address and the type; `vf` (with its IOMMU group) is recorded durably, in the
    PrepareStarted record, before the type is written to that VF, so a rollback, an unprepare or the recovery after
    a crash destroys exactly that vGPU, and only while the VF still has this type: the record is the proof that this
    plugin made it. A VF with a vGPU no record names is never touched."""

    gpu_address: str  # the GPU's PCI function (the SR-IOV physical function)
    type_id: int
    type_name: str
    vf: str | None = None  # the virtual function chosen for it; None: nothing chosen, nothing made
    mdev: str | None = None  # or, on a mediated-device GPU, the UUID chosen for it (plugin/vgpu.py `mdev_uuid`)
    group: int | None = None  # the VF's IOMMU group: /dev/vfio/<group>
    vfio_dev: str | None = None  # "vfio7", known once created (IOMMUFD)
    iommufd: bool = False  # PreferIommuFD on a host with /dev/iommu: the VM gets /dev/vfio/devices/<vfio_dev>
    api_device: bool = False  # enableAPIDevice: also /dev/vfio/vfio (or /dev/iommu)

    @property
    def started(self) -> bool:
        return self.vf is not None or self.mdev is not None

    def record_on(self, device: PreparedDevice) -> PreparedDevice:
        """What an effect made, written into its device's record (kubeletplugin/effect.py `Made`)."""
        return replace(device, vgpu=self)


@dataclass(frozen=True)
class FmPartitionRecord:
    """A Fabric Manager partition passed through to a VM (plugin/effects/fm_partition.py).

    Planned with the partition id and one VfioRecord per member GPU (each recorded as it is bound, as a single
    passthrough's is); `activating` is recorded durably before fmActivateFabricPartition is called, and only after
    the plugin saw the partition inactive: the record is the proof that this plugin activated it, so a rollback, an
    unprepare or the recovery after a crash deactivates exactly that partition, and no other."""

    partition_id: int
    gpus: tuple[VfioRecord, ...]  # the member GPUs, in FM's order
    uuids: tuple[str, ...] = ()  # their UUIDs, in the same order (persistence mode is restored by UUID)
    activating: bool = False

    @property
    def started(self) -> bool:
        return self.activating or any(g.started for g in self.gpus)

    def record_on(self, device: PreparedDevice) -> PreparedDevice:
        """What an effect made, written into its device's record (kubeletplugin/effect.py `Made`)."""
        return replace(device, fm_partition=self)


@dataclass(frozen=True)
class PreparedDevice:
    request_names: tuple[str, ...]
    pool: str
    device: str
    cdi_device_ids: tuple[str, ...] = ()
    share_id: str | None = None
    gpu_uuid: str | None = None  # the physical GPU (parent for MIG)
    mig: MigRecord | None = None
    sharing: str | None = None  # sharing strategy applied, e.g. "Exclusive"
    # TimeSlicing: the GPU time-slice interval this device holds ("Default|Short|Medium|Long"); recorded in the
    # PrepareStarted record before it is applied, so a rollback or the last unprepare resets the GPU.
    time_slice: str | None = None
    mps: MpsRecord | None = None
    # The allocation result's request with its subrequest ("gpu/big"), where it has one: KEP-5304 device metadata
    # names it (request_names hold what containers reference, the request alone).
    request_ref: str | None = None
    vfio: VfioRecord | None = None  # a GPU passed through to a VM
    vgpu: VgpuRecord | None = None  # a vGPU made for a VM
    fm_partition: FmPartitionRecord | None = None  # a Fabric Manager partition passed through to a VM


# The GPU driver's claim record and checkpoint: the layer's (kubeletplugin/claimrecord.py) with this driver's device
# record and no claim details.
ClaimRecord = claimrecord.ClaimRecord[PreparedDevice, None]
Checkpoint = claimrecord.Checkpoint[PreparedDevice, None]


# --- encoding ------------------------------------------------------------------------------------


def _encode_device(dev: PreparedDevice) -> dict[str, Any]:
    out: dict[str, Any] = {
        "requestNames": list(dev.request_names),
        "pool": dev.pool,
        "device": dev.device,
        "cdiDeviceIds": list(dev.cdi_device_ids),
    }
    # Optional fields are omitted when unset so older readers never see surprises.
    if dev.share_id is not None:
        out["shareId"] = dev.share_id
    if dev.gpu_uuid is not None:
        out["gpuUuid"] = dev.gpu_uuid
    if dev.sharing is not None:
        out["sharing"] = dev.sharing
    if dev.time_slice is not None:
        out["timeSlice"] = dev.time_slice
    if dev.request_ref is not None:
        out["requestRef"] = dev.request_ref
    if dev.mig is not None:
        mig = {
            "parentUuid": dev.mig.parent_uuid,
            "profileId": dev.mig.profile_id,
            "placementStart": dev.mig.placement_start,
            "placementSize": dev.mig.placement_size,
            "gpuInstanceId": dev.mig.gpu_instance_id,
            "computeInstanceId": dev.mig.compute_instance_id,
            "uuid": dev.mig.uuid,
        }
        out["mig"] = {k: v for k, v in mig.items() if v is not None}
    if dev.mps is not None:
        mps = {
            "daemon": dev.mps.daemon,
            "activeThreadPercentage": dev.mps.active_thread_percentage,
            "pinnedMemoryLimit": dev.mps.pinned_memory_limit,
            "share": dev.mps.share or None,
            "uuid": dev.mps.uuid,
            "multiUser": dev.mps.multi_user or None,
        }
        out["mps"] = {k: v for k, v in mps.items() if v is not None}
    if dev.vfio is not None:
        out["vfio"] = _encode_vfio(dev.vfio)
    if dev.vgpu is not None:
        out["vgpu"] = _encode_vgpu(dev.vgpu)
    if dev.fm_partition is not None:
        out["fmPartition"] = {
            "partitionId": dev.fm_partition.partition_id,
            "gpus": [_encode_vfio(g) for g in dev.fm_partition.gpus],
            "uuids": list(dev.fm_partition.uuids),
            **({"activating": True} if dev.fm_partition.activating else {}),
        }
    return out


def _encode_vgpu(vgpu: VgpuRecord) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "gpuAddress": vgpu.gpu_address,
        "typeId": vgpu.type_id,
        "typeName": vgpu.type_name,
        "vf": vgpu.vf,
        "mdev": vgpu.mdev,
        "group": vgpu.group,
        "vfioDev": vgpu.vfio_dev,
        "iommufd": vgpu.iommufd or None,
        "apiDevice": vgpu.api_device or None,
    }
    return {k: v for k, v in doc.items() if v is not None}


def _decode_vgpu(raw: Mapping[str, Any]) -> VgpuRecord:
    return VgpuRecord(
        gpu_address=str(raw["gpuAddress"]),
        type_id=int(raw["typeId"]),
        type_name=str(raw.get("typeName") or ""),
        vf=optional_str(raw.get("vf")),
        mdev=optional_str(raw.get("mdev")),
        group=optional_int(raw.get("group")),
        vfio_dev=optional_str(raw.get("vfioDev")),
        iommufd=bool(raw.get("iommufd", False)),
        api_device=bool(raw.get("apiDevice", False)),
    )


def _encode_vfio(vfio: VfioRecord) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "address": vfio.address,
        "group": vfio.group,
        "driver": vfio.driver,
        "functions": [_encode_vfio_function(f) for f in vfio.functions],
        "persistenceMode": vfio.persistence_mode,
        "iommufd": vfio.iommufd or None,
        "apiDevice": vfio.api_device or None,
        "vfioDev": vfio.vfio_dev,
    }
    return {k: v for k, v in doc.items() if v is not None}


def _encode_vfio_function(function: VfioFunction) -> dict[str, Any]:
    out: dict[str, Any] = {"address": function.address, "driver": function.driver}
    if function.persistence_mode is not None:
        out["persistenceMode"] = function.persistence_mode
    return out


def _decode_vfio_function(raw: Mapping[str, Any]) -> VfioFunction:
    persistence = raw.get("persistenceMode")
    return VfioFunction(
        str(raw["address"]), optional_str(raw.get("driver")), None if persistence is None else bool(persistence)
    )


def _decode_vfio(raw: Mapping[str, Any]) -> VfioRecord:
    persistence = raw.get("persistenceMode")
    return VfioRecord(
        address=str(raw["address"]),
        group=int(raw["group"]),
        driver=str(raw.get("driver") or "vfio-pci"),
        functions=tuple(_decode_vfio_function(f) for f in raw.get("functions") or ()),
        persistence_mode=None if persistence is None else bool(persistence),
        iommufd=bool(raw.get("iommufd", False)),
        api_device=bool(raw.get("apiDevice", False)),
        vfio_dev=optional_str(raw.get("vfioDev")),
    )


def _decode_device(raw: Mapping[str, Any]) -> PreparedDevice:
    mig_raw = raw.get("mig")
    mig = None
    if isinstance(mig_raw, Mapping):
        mig = MigRecord(
            parent_uuid=str(mig_raw["parentUuid"]),
            profile_id=int(mig_raw["profileId"]),
            placement_start=int(mig_raw["placementStart"]),
            placement_size=int(mig_raw.get("placementSize", 0)),
            gpu_instance_id=optional_int(mig_raw.get("gpuInstanceId")),
            compute_instance_id=optional_int(mig_raw.get("computeInstanceId")),
            uuid=optional_str(mig_raw.get("uuid")),
        )
    mps_raw = raw.get("mps")
    mps = None
    if isinstance(mps_raw, Mapping):
        mps = MpsRecord(
            daemon=str(mps_raw["daemon"]),
            active_thread_percentage=optional_int(mps_raw.get("activeThreadPercentage")),
            pinned_memory_limit=optional_int(mps_raw.get("pinnedMemoryLimit")),
            share=bool(mps_raw.get("share", False)),
            uuid=optional_str(mps_raw.get("uuid")),
            multi_user=bool(mps_raw.get("multiUser", False)),
        )
    return PreparedDevice(
        request_names=tuple(str(r) for r in raw.get("requestNames") or ()),
        pool=str(raw["pool"]),
        device=str(raw["device"]),
        cdi_device_ids=tuple(str(c) for c in raw.get("cdiDeviceIds") or ()),
        share_id=optional_str(raw.get("shareId")),
        gpu_uuid=optional_str(raw.get("gpuUuid")),
        mig=mig,
        sharing=optional_str(raw.get("sharing")),
        time_slice=optional_str(raw.get("timeSlice")),
        mps=mps,
        request_ref=optional_str(raw.get("requestRef")),
        vfio=_decode_vfio(raw["vfio"]) if isinstance(raw.get("vfio"), Mapping) else None,
        vgpu=_decode_vgpu(raw["vgpu"]) if isinstance(raw.get("vgpu"), Mapping) else None,
        fm_partition=_decode_fm_partition(raw["fmPartition"]) if isinstance(raw.get("fmPartition"), Mapping) else None,
    )


def _decode_fm_partition(raw: Mapping[str, Any]) -> FmPartitionRecord:
    return FmPartitionRecord(
        partition_id=int(raw["partitionId"]),
        gpus=tuple(_decode_vfio(g) for g in raw.get("gpus") or ()),
        uuids=tuple(str(u) for u in raw.get("uuids") or ()),
        activating=bool(raw.get("activating", False)),
    )


class GpuRecordFormat:
    """How the GPU driver's device records are written in the layer's checkpoint (`claimrecord.RecordFormat`)."""

    # An older plugin's reading of a state it does not know (PrepareAborted is never written here).
    states = frozenset({ClaimState.PREPARE_STARTED, ClaimState.PREPARE_COMPLETED, ClaimState.UNPREPARE_STARTED})

    def encode_device(self, device: PreparedDevice) -> dict[str, Any]:
        return _encode_device(device)

    def decode_device(self, raw: Mapping[str, Any]) -> PreparedDevice:
        return _decode_device(raw)

    def encode_details(self, details: None) -> dict[str, Any]:
        return {}

    def decode_details(self, raw: Mapping[str, Any]) -> None:
        return None


GPU_RECORDS = GpuRecordFormat()


# --- storage ---------------------------------------------------------------------------------------


class CheckpointStore(store.CheckpointStore[Checkpoint]):
    """The GPU driver's checkpoint file: the layer's store (`dra_driver.kubeletplugin.checkpoint`) with this
    module's codec."""

    def __init__(
        self,
        path: Path,
        *,
        boot_id_path: Path = store.DEFAULT_BOOT_ID_PATH,
        clock_ns: Callable[[], int] = time.time_ns,
        on_loss: Callable[[str], None] | None = None,
        on_write: Callable[[float], None] | None = None,
        on_quarantine: Callable[[Path, str], None] | None = None,
    ) -> None:
        super().__init__(
            path, ClaimCodec(GPU_RECORDS), boot_id_path=boot_id_path, clock_ns=clock_ns, on_loss=on_loss,
            on_write=on_write, on_quarantine=on_quarantine,
        )
