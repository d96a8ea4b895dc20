"""CDI spec: the claim's spec file, which the container runtime reads to hand the devices to the containers
(plugin/cdi.py writes it; docs/kubelet-plugin.md). Every claim has one; it is all a whole GPU or a static MIG
device used exclusively does to the node, so the whole-GPU kind is this effect alone.

The engine runs it last, after the device effects (the crash points `prepare:after-devices` and
`prepare:after-cdi` lie on either side of it), and undoes it after them. Records: each device's CDI id (fixed at
plan time: `<vendor>/claim=<claimUID>-<device>`) and the sharing the container is told.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import structlog

from dra_driver.inventory.catalog import AllocatableDevice
from dra_driver.plugin.cdi import ClaimSpecWriter, DeviceForCdi, FmPartitionCdi, MpsClient, VfioCdi, VgpuCdi
from dra_driver.plugin.checkpoint import Checkpoint, ClaimRecord, PreparedDevice
from dra_driver.plugin.effects import base
from dra_driver.plugin.mps import daemon_spec, share_env
from dra_driver.plugin.ownership import AllocatedClaim

log = structlog.get_logger(__name__)


class CdiSpec(base.GpuEffect):
    kind = "cdi-spec"

    def __init__(self, tools: base.NodeTools) -> None:
        self.writer: ClaimSpecWriter = tools.cdi
        # Where the MPS daemons' directories are (None: MPS is not enabled).
        self._mps_root: Path | None = tools.mps.root if tools.mps is not None else None

    def plan(self, claim: base.ClaimPlan) -> base.ClaimPlan:
        uid = claim.ref.uid
        records = tuple(
            replace(
                record,
                cdi_device_ids=(self.writer.cdi_id(uid, record.device),),
                sharing="MPS" if record.mps is not None else str(config.sharing.strategy),
            )
            for record, config in zip(claim.records, claim.configs, strict=True)
        )
        return base.replace_records(claim, records)

    def apply(
        self, claim: base.ClaimPlan, records: base.Records, checkpoint: Checkpoint, created: base.Created
    ) -> base.Records:
        self.writer.write(claim.ref.uid, [self._device(d, r) for d, r in zip(claim.devices, records, strict=True)])
        return records

    def undo(self, owner: ClaimRecord, records: base.Records, checkpoint: Checkpoint, *, rollback: bool) -> None:
        self.writer.remove(owner.uid)

    def verify(
        self, owner: ClaimRecord, records: base.Records, checkpoint: Checkpoint, catalog: base.Catalog
    ) -> list[str]:
        """The spec must hold exactly the bytes this plugin would write now."""
        devices = self._devices(records, catalog)
        if devices is None:
            # A device left the catalog (GPU gone): the spec cannot be re-rendered, only checked to exist.
            path = self.writer.spec_path(owner.uid)
            return [] if path.is_file() else [f"CDI spec {path} is missing"]
        problem = self.writer.problem(owner.uid, devices)
        return [] if problem is None else [problem]

    def repair(
        self, owner: ClaimRecord, records: base.Records, checkpoint: Checkpoint, catalog: base.Catalog,
        created: base.Created,
    ) -> base.Records:
        # Always rewritten: the device effects before it may have changed what it says (a re-created MIG device);
        # the CDI ids stay the same, so the kubelet's copy stays valid.
        devices = self._devices(records, catalog)
        assert devices is not None  # every device is in the catalog (checked before a repair)
        self.writer.write(owner.uid, devices)
        return records

    def adopt(self, claim: base.ClaimPlan) -> tuple[base.ClaimPlan, bool]:
        return claim, self.writer.spec_path(claim.ref.uid).is_file()

    def leftovers(self, catalog: base.Catalog) -> bool:
        return bool(self.writer.claim_uids_on_disk())

    def sweep_temp_files(self) -> list[Path]:
        return self.writer.sweep_temp_files()

    def sweep(
        self, checkpoint: Checkpoint, allocated: Mapping[str, AllocatedClaim] | None, catalog: base.Catalog
    ) -> tuple[str, ...]:
        keep = set(checkpoint.claims) | set(allocated or ())
        removed = []
        for uid in sorted(self.writer.claim_uids_on_disk() - keep):
            self.writer.remove(uid)
            removed.append(uid)
            log.info("removed a CDI spec no claim owns", claim_uid=uid)
        return tuple(removed)

    def _devices(self, records: base.Records, catalog: base.Catalog) -> list[DeviceForCdi] | None:
        """The CDI layer's view of recorded devices (None if one is no longer in the catalog)."""
        out = []
        for record in records:
            device = catalog.get(record.device)
            if device is None:
                return None
            out.append(self._device(device, record))
        return out

    def _device(self, device: AllocatableDevice, record: PreparedDevice) -> DeviceForCdi:
        mps = None
        if record.mps is not None and self._mps_root is not None:
            spec = daemon_spec(self._mps_root, record.mps.daemon, ())
            mps = MpsClient(spec.pipe_directory, spec.shm_directory, share_env(record))
        return DeviceForCdi(
            allocatable=device,
            visible_uuid=base.visible_uuid(device, record),
            sharing=record.sharing or "Exclusive",
            request_names=record.request_names,
            gpu_instance_id=record.mig.gpu_instance_id if record.mig else None,
            compute_instance_id=record.mig.compute_instance_id if record.mig else None,
            mps=mps,
            vfio=_vfio_cdi(record),
            vgpu=VgpuCdi(record.vgpu.vf, record.vgpu.type_name, record.vgpu.mdev)
            if record.vgpu is not None and record.vgpu.started
            else None,
            fm_partition=_fm_partition_cdi(record),
        )


def _vfio_cdi(record: PreparedDevice) -> VfioCdi | None:
    """The VFIO nodes of a GPU passed through, or of a vGPU's VF."""
    if record.vfio is not None:
        return VfioCdi(record.vfio.group, record.vfio.vfio_dev, record.vfio.iommufd, record.vfio.api_device)
    if record.fm_partition is not None and record.fm_partition.gpus:
        first = record.fm_partition.gpus[0]
        return VfioCdi(first.group, first.vfio_dev, first.iommufd, first.api_device)
    vgpu = record.vgpu
    if vgpu is not None and vgpu.group is not None:
        return VfioCdi(vgpu.group, vgpu.vfio_dev, vgpu.iommufd, vgpu.api_device)
    return None


def _fm_partition_cdi(record: PreparedDevice) -> FmPartitionCdi | None:
    """A Fabric Manager partition's member GPUs' VFIO nodes and addresses."""
    made = record.fm_partition
    if made is None:
        return None
    gpus = tuple(VfioCdi(g.group, g.vfio_dev, g.iommufd, g.api_device) for g in made.gpus)
    return FmPartitionCdi(made.partition_id, gpus, tuple(g.address for g in made.gpus))
