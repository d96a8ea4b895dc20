"""vGPUs on the node: create one of a type on an SR-IOV virtual function of its GPU, and destroy it (docs/vgpu.md).

Create (`create`, for a `vgpu` device): the GPU's virtual functions with the NVIDIA per-VF interface → refuse when
the GPU holds vGPUs of another type (a GPU hosts one type at a time) or no free VF lists the type in its
creatable_vgpu_types (the GPU is full, in MIG mode, or the type is not its) → the chosen VF and its IOMMU group are
recorded durably → the type id is written to the VF's current_vgpu_type → the VF is read back (its type, its
IOMMUFD cdev).
Destroy (`destroy`, unprepare and every rollback): 0 is written to the recorded VF's current_vgpu_type, only while
that VF still has the recorded type; a VF without a type, or with another, is left as it is. Idempotent: a crash
anywhere is finished by running it again.

On a GPU without such VFs that is a mediated-device parent (GPUs before Ampere, older vGPU releases): the type's
`mdev_supported_types/nvidia-<type id>` must have an instance available → the UUID (`mdev_uuid`: name-based on the
claim's UID and the device, so a lost checkpoint's rebuild finds it again) is recorded durably → the UUID is written
to the type's `create`; destroy writes 1 to the recorded device's `remove`.

A vGPU no record names is never destroyed: the record, written before the type, is the only proof that this plugin
made it (another tool, or an admin, may make vGPUs on the same host).

Every step is a crash point (`vgpu:*` in plugin/faults.py).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from dataclasses import replace

import structlog

from dra_driver.claimconfig.api import IommuBackendPolicy, VfioDeviceConfig
from dra_driver.inventory.catalog import AllocatableDevice
from dra_driver.pci.model import PciError, pci_address
from dra_driver.pci.vgpu import NO_VGPU_TYPE, Mdev, MdevType, VgpuSysfs, VirtualFunction, mdev_type_dir
from dra_driver.plugin.actuator import PrepareError
from dra_driver.plugin.checkpoint import VgpuRecord
from dra_driver.plugin.faults import FaultPoints

log = structlog.get_logger(__name__)

NO_VFS = (
    "GPU {name} ({address}) has no SR-IOV virtual function with the NVIDIA vGPU interface (nvidia/current_vgpu_type) "
    "and is no mediated-device parent: install the NVIDIA vGPU Manager and, on Ampere and later (R550 or newer), "
    "enable the GPU's VFs (/usr/lib/nvidia/sriov-manage -e {address})"
)
# The namespace of the mediated-device UUIDs this plugin makes (`mdev_uuid`), a fixed random UUID.
MDEV_NAMESPACE = uuid.UUID("5c0e6a2e-8d7b-4f4e-9a51-0b7d3c2f9e61")


def mdev_uuid(claim_uid: str, device_name: str) -> str:
    """The UUID of the mediated device a claim's vGPU device gets: the same for the same claim and device, so the
    recovery after a lost checkpoint finds it again (and no two claims' devices share one)."""
    return str(uuid.uuid5(MDEV_NAMESPACE, f"{claim_uid}/{device_name}"))


class VgpuMaker:
    """Creates and destroys vGPUs (the vGPU effect, plugin/effects/vgpu.py, decides when). `iommufd`: whether the
    host has /dev/iommu (PreferIommuFD then hands the VM the VF's cdev)."""

    def __init__(
        self, sysfs: VgpuSysfs, faults: FaultPoints | None = None, iommufd: Callable[[], bool] | None = None
    ) -> None:
        self.sysfs = sysfs
        self.faults = faults or FaultPoints()
        self._iommufd = iommufd or (lambda: False)

    def plan(self, device: AllocatableDevice, config: VfioDeviceConfig) -> VgpuRecord:
        """What the vGPU will be (its VF comes at create)."""
        assert device.vgpu is not None
        iommufd = config.backend_policy is IommuBackendPolicy.PREFER_IOMMU_FD and self._iommufd()
        return VgpuRecord(
            pci_address(device.gpu.info.pci_bus_id), device.vgpu.id, device.vgpu.name,
            iommufd=iommufd, api_device=config.enable_api_device,
        )  # fmt: skip

    def create(
        self, device: AllocatableDevice, record: VgpuRecord, recorded: Callable[[VgpuRecord], None], owner: str
    ) -> VgpuRecord:
        """Make the vGPU on a free VF (or as a mediated device of `owner`, the claim's UID); `recorded` makes the
        record (with the VF or UUID) durable before the vGPU is made. Raises PrepareError, naming the GPU and what
        holds it."""
        vfs = self._vfs(record.gpu_address)
        if not vfs:
            types = self._mdev_types(record.gpu_address)
            if not types:
                raise PrepareError(NO_VFS.format(name=device.name, address=record.gpu_address))
            return self._create_mdev(device, record, recorded, owner, types)
        held = sorted({vf.current_type for vf in vfs if vf.current_type != NO_VGPU_TYPE})
        if held and held != [record.type_id]:
            raise PrepareError(
                f"GPU of device {device.name} ({record.gpu_address}) holds vGPUs of type id "
                f"{', '.join(map(str, held))}, not {record.type_name} ({record.type_id}): a GPU hosts vGPUs of one "
                "type at a time; the kubelet retries once they are gone (or request that type)"
            )
        free = [vf for vf in vfs if vf.current_type == NO_VGPU_TYPE and record.type_id in vf.creatable]
        if not free:
            raise PrepareError(
                f"no virtual function of the GPU of device {device.name} ({record.gpu_address}) can create vGPU type "
                f"{record.type_name} ({record.type_id}) now (creatable_vgpu_types): the GPU is full, in MIG mode or "
                "passed through; the kubelet retries"
            )
        chosen = free[0]
        record = replace(record, vf=chosen.address, group=chosen.iommu_group)
        recorded(record)
        self.faults.reached("vgpu:after-record")
        self._write(chosen.address, record.type_id, f"creating vGPU {record.type_name} for {device.name}")
        self.faults.reached("vgpu:after-create")
        made = self._vf(record)
        if made is None or made.current_type != record.type_id:
            raise PrepareError(f"virtual function {chosen.address} does not show vGPU type {record.type_id} after it "
                               "was written (current_vgpu_type); see the kernel log (dmesg)")  # fmt: skip
        if record.iommufd and not (made.vfio_dev or "").startswith("vfio"):
            raise PrepareError(
                f"vGPU {record.type_name} on {chosen.address} has no IOMMUFD device (vfio-dev); the kernel lacks "
                "CONFIG_VFIO_DEVICE_CDEV: use iommu.backendPolicy LegacyOnly"
            )
        log.info("vGPU created", device=device.name, vf=chosen.address, type=record.type_name)
        return replace(record, vfio_dev=made.vfio_dev if record.iommufd else None)

    def _create_mdev(
        self,
        device: AllocatableDevice,
        record: VgpuRecord,
        recorded: Callable[[VgpuRecord], None],
        owner: str,
        types: tuple[MdevType, ...],
    ) -> VgpuRecord:
        wanted = mdev_type_dir(record.type_id)
        name = mdev_uuid(owner, device.name)
        existing = self._mdev(name)
        if existing is not None:
            # Only this claim's device gets this UUID: made by an earlier prepare of it whose record is gone.
            if existing.type_dir != wanted or existing.parent != record.gpu_address or existing.iommu_group is None:
                raise PrepareError(f"mediated device {name} of device {device.name} exists as {existing.type_dir} "
                                   f"on {existing.parent}, not {wanted} on {record.gpu_address}")  # fmt: skip
            record = replace(record, mdev=name, iommufd=False, group=existing.iommu_group)
            recorded(record)
            log.info("vGPU found made already (its UUID is the claim's)", device=device.name, mdev=name)
            return record
        found = next((t for t in types if t.type_dir == wanted), None)
        if found is None:
            raise PrepareError(f"GPU of device {device.name} ({record.gpu_address}) has no mediated-device type "
                               f"{wanted} ({record.type_name})")  # fmt: skip
        if found.available < 1:
            raise PrepareError(
                f"GPU of device {device.name} ({record.gpu_address}) has no instance of vGPU type {record.type_name} "
                f"available ({wanted}/available_instances 0): it hosts another type, is full or in MIG mode; the "
                "kubelet retries"
            )
        record = replace(record, mdev=name, iommufd=False)  # the VM gets the mediated device's group node
        recorded(record)
        self.faults.reached("vgpu:after-record")
        try:
            self.sysfs.create_mdev(record.gpu_address, wanted, name)
        except PciError as exc:
            raise PrepareError(f"creating vGPU {record.type_name} for {device.name} as mediated device {name} "
                               f"failed: {exc}") from exc  # fmt: skip
        self.faults.reached("vgpu:after-create")
        made = self._mdev(name)
        if made is None or made.type_dir != wanted or made.iommu_group is None:
            raise PrepareError(f"mediated device {name} is not there as {wanted} with an IOMMU group after it was "
                               "created; see the kernel log (dmesg)")  # fmt: skip
        log.info("vGPU created", device=device.name, mdev=name, type=record.type_name)
        return replace(record, group=made.iommu_group)

    def adopt(self, device: AllocatableDevice, owner: str) -> VgpuRecord | None:
        """Rebuilding a lost checkpoint: the claim's mediated device, found by the UUID only this claim's device has
        (a vGPU on a VF carries no such proof: None)."""
        assert device.vgpu is not None
        made = self._mdev(mdev_uuid(owner, device.name))
        if made is None or made.type_dir != mdev_type_dir(device.vgpu.id):
            return None
        return VgpuRecord(pci_address(device.gpu.info.pci_bus_id), device.vgpu.id, device.vgpu.name, mdev=made.uuid,
                          group=made.iommu_group)  # fmt: skip

    def destroy(self, record: VgpuRecord) -> None:
        """Write 0 to the recorded VF while it has the recorded type, or remove the recorded mediated device
        (idempotent); raises PrepareError when the driver refuses (the record is kept; the kubelet retries)."""
        if record.mdev is not None:
            if self._mdev(record.mdev) is None:
                return  # gone already
            try:
                self.sysfs.remove_mdev(record.mdev)
            except PciError as exc:
                raise PrepareError(f"removing vGPU {record.type_name} (mediated device {record.mdev}) failed: {exc} "
                                   "(a VM still using it?)") from exc  # fmt: skip
            self.faults.reached("vgpu:after-destroy")
            log.info("vGPU destroyed", mdev=record.mdev, type=record.type_name)
            return
        if record.vf is None:
            return  # nothing was made
        vf = self._vf(record)
        if vf is None or vf.current_type == NO_VGPU_TYPE:
            return  # gone already (destroyed before a crash, or SR-IOV turned off)
        if vf.current_type != record.type_id:
            log.warning("a VF recorded for a vGPU holds another type now; left alone", vf=record.vf,
                        recorded=record.type_id, found=vf.current_type)  # fmt: skip
            return
        self._write(record.vf, NO_VGPU_TYPE, f"destroying vGPU {record.type_name}")
        self.faults.reached("vgpu:after-destroy")
        log.info("vGPU destroyed", vf=record.vf, type=record.type_name)

    def problems(self, record: VgpuRecord) -> list[str]:
        """What no longer matches a prepared vGPU."""
        if record.mdev is not None:
            made = self._mdev(record.mdev)
            if made is None or made.type_dir != mdev_type_dir(record.type_id):
                return [f"mediated device {record.mdev} of the vGPU {record.type_name} is gone"]
            return []
        if record.vf is None:
            return [f"the vGPU {record.type_name} on {record.gpu_address} was never created"]
        vf = self._vf(record)
        if vf is None:
            return [f"virtual function {record.vf} of the vGPU {record.type_name} is gone (SR-IOV disabled?)"]
        if vf.current_type != record.type_id:
            return [f"virtual function {record.vf} has vGPU type {vf.current_type}, not {record.type_id}"]
        return []

    def remake(self, record: VgpuRecord) -> VgpuRecord:
        """Repair: the type again on the recorded VF, where it lost it (a VF with another type cannot be repaired),
        or the recorded mediated device again."""
        if record.mdev is not None:
            if self._mdev(record.mdev) is None:
                try:
                    self.sysfs.create_mdev(record.gpu_address, mdev_type_dir(record.type_id), record.mdev)
                except PciError as exc:
                    raise PrepareError(f"re-creating mediated device {record.mdev} failed: {exc}") from exc
            made = self._mdev(record.mdev)
            if made is None:
                raise PrepareError(f"mediated device {record.mdev} is not there after it was re-created")
            return replace(record, group=made.iommu_group)
        vf = self._vf(record)
        if vf is None or record.vf is None:
            raise PrepareError(f"virtual function {record.vf} of the vGPU {record.type_name} is gone; cannot repair")
        if vf.current_type == NO_VGPU_TYPE:
            self._write(record.vf, record.type_id, f"re-creating vGPU {record.type_name}")
            vf = self._vf(record)
        if vf is None or vf.current_type != record.type_id:
            raise PrepareError(f"virtual function {record.vf} holds vGPU type "
                               f"{vf.current_type if vf else 'none'}, not {record.type_id}; cannot repair")  # fmt: skip
        return replace(record, vfio_dev=vf.vfio_dev if record.iommufd else None)

    def typed_vfs(self, gpu_addresses: Iterable[str]) -> list[str]:
        """The VFs of these GPUs that have a vGPU type now (whoever made it)."""
        return [vf.address for a in gpu_addresses for vf in self._vfs(a) if vf.current_type != NO_VGPU_TYPE]

    def _vfs(self, gpu_address: str) -> tuple[VirtualFunction, ...]:
        try:
            return self.sysfs.virtual_functions(gpu_address)
        except PciError as exc:
            raise PrepareError(f"reading the virtual functions of GPU {gpu_address} failed: {exc}") from exc

    def _mdev_types(self, gpu_address: str) -> tuple[MdevType, ...]:
        try:
            return self.sysfs.mdev_types(gpu_address)
        except PciError as exc:
            raise PrepareError(f"reading the mediated-device types of GPU {gpu_address} failed: {exc}") from exc

    def _mdev(self, name: str) -> Mdev | None:
        try:
            return self.sysfs.mdev(name)
        except PciError as exc:
            raise PrepareError(f"reading mediated device {name} failed: {exc}") from exc

    def _vf(self, record: VgpuRecord) -> VirtualFunction | None:
        return next((vf for vf in self._vfs(record.gpu_address) if vf.address == record.vf), None)

    def _write(self, vf: str, type_id: int, what: str) -> None:
        try:
            self.sysfs.set_vgpu_type(vf, type_id)
        except PciError as exc:
            raise PrepareError(f"{what} on virtual function {vf} failed: {exc}") from exc
