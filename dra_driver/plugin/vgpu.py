"""vGPUs on the node: create one of a type on an SR-IOV virtual function of its GPU, and destroy it (docs/vgpu.md).

Create (`create`, for a `vgpu` device): the GPU's virtual functions with the NVIDIA per-VF interface → refuse when
the GPU holds vGPUs of another type (a GPU hosts one type at a time) or no free VF lists the type in its
creatable_vgpu_types (the GPU is full, in MIG mode, or the type is not its) → the chosen VF and its IOMMU group are
recorded durably → the type id is written to the VF's current_vgpu_type → the VF is read back (its type, its
IOMMUFD cdev).
Destroy (`destroy`, unprepare and every rollback): 0 is written to the recorded VF's current_vgpu_type, only while
that VF still has the recorded type; a VF without a type, or with another, is left as it is. Idempotent: a crash
anywhere is finished by running it again.

A vGPU no record names is never destroyed: the record, written before the type, is the only proof that this plugin
made it (another tool, or an admin, may make vGPUs on the same host).

Every step is a crash point (`vgpu:*` in plugin/faults.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace

import structlog

from dra_driver.claimconfig.api import IommuBackendPolicy, VfioDeviceConfig
from dra_driver.inventory.catalog import AllocatableDevice
from dra_driver.pci.model import PciError, pci_address
from dra_driver.pci.vgpu import NO_VGPU_TYPE, VgpuSysfs, VirtualFunction
from dra_driver.plugin.actuator import PrepareError
from dra_driver.plugin.checkpoint import VgpuRecord
from dra_driver.plugin.faults import FaultPoints

log = structlog.get_logger(__name__)

NO_VFS = (
    "GPU {name} ({address}) has no SR-IOV virtual function with the NVIDIA vGPU interface (nvidia/current_vgpu_type): "
    "install the NVIDIA vGPU Manager (R550 or newer) and enable the GPU's VFs (/usr/lib/nvidia/sriov-manage -e "
    "{address})"
)


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
        self, device: AllocatableDevice, record: VgpuRecord, recorded: Callable[[VgpuRecord], None]
    ) -> VgpuRecord:
        """Make the vGPU on a free VF; `recorded` makes the record (with the VF) durable before the type is
        written. Raises PrepareError, naming the GPU and what holds it."""
        vfs = self._vfs(record.gpu_address)
        if not vfs:
            raise PrepareError(NO_VFS.format(name=device.name, address=record.gpu_address))
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

    def destroy(self, record: VgpuRecord) -> None:
        """Write 0 to the recorded VF while it has the recorded type (idempotent); raises PrepareError when the
        driver refuses (the record is kept; the kubelet retries)."""
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
        if record.vf is None:
            return [f"the vGPU {record.type_name} on {record.gpu_address} was never created"]
        vf = self._vf(record)
        if vf is None:
            return [f"virtual function {record.vf} of the vGPU {record.type_name} is gone (SR-IOV disabled?)"]
        if vf.current_type != record.type_id:
            return [f"virtual function {record.vf} has vGPU type {vf.current_type}, not {record.type_id}"]
        return []

    def remake(self, record: VgpuRecord) -> VgpuRecord:
        """Repair: the type again on the recorded VF, where it lost it (a VF with another type cannot be repaired)."""
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

    def _vf(self, record: VgpuRecord) -> VirtualFunction | None:
        return next((vf for vf in self._vfs(record.gpu_address) if vf.address == record.vf), None)

    def _write(self, vf: str, type_id: int, what: str) -> None:
        try:
            self.sysfs.set_vgpu_type(vf, type_id)
        except PciError as exc:
            raise PrepareError(f"{what} on virtual function {vf} failed: {exc}") from exc
