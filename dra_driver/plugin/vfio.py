"""VFIO passthrough on the node: move a GPU's IOMMU group from its drivers to vfio-pci and back.

Prepare (`bind`, for a `vfio` device; docs/passthrough.md, docs/reference/passthrough.md):
    the GPU is bound to nvidia → no MIG instances, no processes (NVML's compute, graphics and MPS lists), no MPS
    daemon of this plugin on it, no SR-IOV VFs → the functions to move (every function of the IOMMU group bound
    to a host driver, and the GPU's consumer functions: the audio function of a VGA GPU), each of which must be
    the GPU's own (its slot, or its consumer), another NVIDIA GPU as idle as the GPU itself, or a host function
    whose class or driver an admin allows (`--passthrough-allow-rebind`); anything else refuses the prepare,
    naming it (which claim holds another GPU of the group is the effect's `refuse`, against the checkpoint) →
    the vfio-pci module (a variant where modules.alias matches) is loaded → the functions and their drivers,
    and persistence mode, are recorded durably → persistence mode off → per function (consumers first, the
    GPU last): driver_override ← vfio driver, unbind from its driver, bind to the vfio driver.
Release (`restore`, unprepare and every rollback): per recorded function (the GPU first): driver_override ←
    its driver, unbind from the vfio driver, bind to its driver, driver_override cleared; then persistence mode
    as it was. Idempotent: each step looks at what the function is bound to now, so a crash anywhere is finished
    by running it again. A function is never left bound to no driver: where the bind to its own driver fails,
    it is bound back to the vfio driver and the release fails (the record is kept; the next try repeats it).

Every step is a crash point (`vfio:*` in plugin/faults.py); they fire once per function.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import structlog

from dra_driver.claimconfig.api import IommuBackendPolicy, VfioDeviceConfig
from dra_driver.inventory.catalog import AllocatableDevice
from dra_driver.nvml.backend import NvmlBackend
from dra_driver.nvml.types import NvmlError, NvmlReturn
from dra_driver.pci.model import (
    NO_REBIND,
    NVIDIA_DRIVER,
    REBIND_FLAG,
    PciError,
    PciFunction,
    RebindAllowance,
    is_nvidia_gpu,
    is_vfio_driver,
    pci_address,
    slot_of,
)
from dra_driver.pci.sysfs import PciSysfs
from dra_driver.plugin.actuator import PrepareError
from dra_driver.plugin.checkpoint import VfioFunction, VfioRecord
from dra_driver.plugin.faults import FaultPoints

log = structlog.get_logger(__name__)

IOMMU_OFF = (
    "VFIO passthrough needs the IOMMU, and this node has none (/sys/kernel/iommu_groups is empty): boot the node "
    "with intel_iommu=on (or amd_iommu=on) iommu=pt and enable VT-d/AMD-Vi in the firmware"
)
_UNANSWERABLE = {NvmlReturn.NOT_SUPPORTED, NvmlReturn.FUNCTION_NOT_FOUND}


class VfioBinder:
    """Binds GPUs to vfio-pci and back (the VFIO passthrough effect, plugin/effects/vfio_passthrough.py, decides
    when). `daemons_on`: the GPUs (UUIDs) an MPS daemon of this plugin serves; `allow_rebind`: the host functions
    (by class or driver) a passthrough may move with the GPU (`--passthrough-allow-rebind`)."""

    def __init__(
        self,
        pci: PciSysfs,
        nvml: NvmlBackend,
        faults: FaultPoints | None = None,
        daemons_on: Callable[[], set[str]] | None = None,
        allow_rebind: RebindAllowance = NO_REBIND,
    ) -> None:
        self.pci = pci
        self.nvml = nvml
        self.faults = faults or FaultPoints()
        self._daemons_on = daemons_on or set
        self.allow_rebind = allow_rebind

    # --- plan ------------------------------------------------------------------------------------

    def plan(self, device: AllocatableDevice, config: VfioDeviceConfig) -> VfioRecord:
        """What the device will be: its function and IOMMU group. Raises PrepareError."""
        if not self.pci.iommu_enabled():
            raise PrepareError(IOMMU_OFF)
        address = pci_address(device.gpu.info.pci_bus_id)
        function = self._function(address)
        if function.iommu_group is None:
            raise PrepareError(f"GPU {device.name} ({address}) is in no IOMMU group; {IOMMU_OFF}")
        iommufd = config.backend_policy is IommuBackendPolicy.PREFER_IOMMU_FD and self.pci.iommufd_present()
        return VfioRecord(address, function.iommu_group, iommufd=iommufd, api_device=config.enable_api_device)

    # --- bind ------------------------------------------------------------------------------------

    def bind(
        self, device: AllocatableDevice, record: VfioRecord, recorded: Callable[[VfioRecord], None]
    ) -> VfioRecord:
        """Move the GPU's group to vfio-pci; `recorded` makes the record (with the functions and their drivers)
        durable before anything changes. Returns the record with the device's vfio name."""
        gpu = self._function(record.address)
        if gpu.driver != NVIDIA_DRIVER:
            raise PrepareError(
                f"GPU {device.name} ({record.address}) is bound to {gpu.driver or 'no driver'}, not {NVIDIA_DRIVER}; "
                "the plugin passes through only GPUs the nvidia driver holds (rebind it to nvidia first)"
            )
        self.refuse_busy(device, gpu)
        moving = self._functions_to_move(device, gpu)
        driver = self._vfio_driver(record.address)
        record = replace(record, driver=driver, functions=moving, persistence_mode=self._persistence(device))
        recorded(record)
        self.faults.reached("vfio:after-record")
        if record.persistence_mode:
            self.nvml.set_persistence_mode(device.gpu.uuid, False)
            self.faults.reached("vfio:after-persistence-off")
        for other in record.functions[1:]:
            if other.persistence_mode and (uuid := self._nvml_uuid(other.address)) is not None:
                self.nvml.set_persistence_mode(uuid, False)  # another GPU of the group: off as the GPU's own
        # Consumers first (the audio function links to the GPU as its supplier), the GPU last.
        for function in reversed(record.functions):
            self._move(function.address, driver)
        bound = self._function(record.address)
        if record.iommufd and not (bound.vfio_dev or "").startswith("vfio"):
            raise PrepareError(
                f"GPU {device.name} ({record.address}) is bound to {driver} but has no IOMMUFD device (vfio-dev); "
                "the kernel lacks CONFIG_VFIO_DEVICE_CDEV: use iommu.backendPolicy LegacyOnly"
            )
        log.info("GPU bound to vfio", device=device.name, address=record.address, driver=driver,
                 functions=[f.address for f in record.functions])
        return replace(record, vfio_dev=bound.vfio_dev if record.iommufd else None)

    def refuse_busy(self, device: AllocatableDevice, gpu: PciFunction) -> None:
        """The GPU must serve nothing on the host: no MIG instances, processes, MPS daemon or SR-IOV VFs."""
        self._refuse_busy(f"GPU {device.name}", device.gpu.uuid, gpu)

    def _refuse_busy(self, name: str, uuid: str, gpu: PciFunction) -> None:
        try:
            mode = self.nvml.mig_mode(uuid)
            if mode is not None and mode.current and self.nvml.gpu_instances(uuid):
                raise PrepareError(
                    f"{name} holds MIG instances; a GPU with MIG partitions cannot be passed through "
                    "(release the claims on its partitions, or destroy the instances)"
                )
            pids = self.nvml.running_processes(uuid)
        except NvmlError as exc:
            raise PrepareError(f"cannot check {name} is idle before passthrough: {exc}") from exc
        if pids:
            shown = ", ".join(str(p) for p in pids[:8]) + (" …" if len(pids) > 8 else "")
            raise PrepareError(
                f"{name} is in use by processes {shown} (NVML's process lists); it is passed through only "
                "when idle: stop them (a device plugin, DCGM, a display manager?); the kubelet retries"
            )
        if uuid in self._daemons_on():
            raise PrepareError(f"{name} is served by an MPS daemon of this plugin; it is not passed through")
        if gpu.sriov_numvfs > 0:
            raise PrepareError(
                f"{name} ({gpu.address}) has {gpu.sriov_numvfs} SR-IOV virtual functions enabled; "
                "disable them (echo 0 > sriov_numvfs) to pass the physical GPU through"
            )

    def _persistence(self, device: AllocatableDevice) -> bool | None:
        return self._persistence_of(device.gpu.uuid, device.name)

    def _persistence_of(self, uuid: str, name: str) -> bool | None:
        try:
            return self.nvml.persistence_mode(uuid)
        except NvmlError as exc:
            if exc.code in _UNANSWERABLE:
                return None
            raise PrepareError(f"reading the persistence mode of GPU {name} failed: {exc}") from exc

    def _vfio_driver(self, address: str) -> str:
        module = self.pci.vfio_variant(address)
        try:
            if not self.pci.module_loaded(module):
                self.pci.load_module(module)
        except PciError as exc:
            raise PrepareError(str(exc)) from exc
        driver = self.pci.driver_name(module)
        if driver is None:
            raise PrepareError(f"kernel module {module} is loaded but registered no PCI driver under bus/pci/drivers")
        return driver

    def _functions_to_move(self, device: AllocatableDevice, gpu: PciFunction) -> tuple[VfioFunction, ...]:
        """The GPU first, then the other functions of its group (and its consumers) that a driver holds: a group
        is usable by VFIO only when none of its functions is bound to a host driver. Unbound functions stay so.
        Raises PrepareError, before anything moves, for a function the GPU may not take (`_may_move`)."""
        assert gpu.iommu_group is not None
        others = sorted({*self.pci.group_functions(gpu.iommu_group), *gpu.consumers} - {gpu.address})
        moving = [VfioFunction(gpu.address, gpu.driver)]
        for address in others:
            function = self._function(address)
            if function.driver is not None and not is_vfio_driver(function.driver):
                other_gpu = self._may_move(device, gpu, function)
                persistence = self._persistence_of(other_gpu, address) if other_gpu is not None else None
                moving.append(VfioFunction(address, function.driver, persistence))
        return tuple(moving)

    def _may_move(self, device: AllocatableDevice, gpu: PciFunction, function: PciFunction) -> str | None:
        """A function of the GPU's group, bound to a host driver, moves with the GPU only when it is the GPU's own
        (a function of its slot: the audio and USB functions of a VGA card; or its consumer), another NVIDIA GPU on
        nvidia that is as idle as the GPU itself, or a host function an admin allows by class or driver. Returns
        the other GPU's UUID (None for any other function)."""
        if slot_of(function.address) == slot_of(gpu.address) or function.address in gpu.consumers:
            return None
        if is_nvidia_gpu(function) and function.driver == NVIDIA_DRIVER:
            uuid = self._nvml_uuid(function.address)
            if uuid is None:
                raise PrepareError(
                    f"GPU {device.name} ({gpu.address}) shares IOMMU group {gpu.iommu_group} with the GPU at "
                    f"{function.address}, which NVML does not list; the plugin cannot check that it is idle, so it "
                    "does not pass the group through"
                )
            self._refuse_busy(
                f"GPU {function.address} (in the IOMMU group of {device.name}, so it would move to vfio-pci with it)",
                uuid,
                function,
            )
            return uuid
        if self.allow_rebind.allows(function):
            return None
        driver = function.driver or "no driver"
        raise PrepareError(
            f"GPU {device.name} ({gpu.address}) shares IOMMU group {gpu.iommu_group} with PCI function "
            f"{function.address} (class 0x{function.class_code:06x}, driver {driver}), which is not part of the GPU: "
            f"passing the GPU through would unbind it from {driver} and bind it to vfio-pci, taking it from the host. "
            f"The plugin moves such a function only where an admin allows it by class or driver: "
            f"{REBIND_FLAG} 0x{function.class_code >> 8:04x} or {REBIND_FLAG} {driver} (chart value "
            "passthrough.allowRebind); else give the GPU an IOMMU group of its own (ACS on the PCIe switch)"
        )

    def _nvml_uuid(self, address: str) -> str | None:
        try:
            return next((g.uuid for g in self.nvml.gpus() if pci_address(g.pci_bus_id) == address), None)
        except NvmlError as exc:
            raise PrepareError(f"cannot list NVML's GPUs to check the IOMMU group of {address}: {exc}") from exc

    def group_members(self, group: int) -> frozenset[str]:
        """The functions of an IOMMU group now (empty when sysfs cannot say)."""
        try:
            return frozenset(self.pci.group_functions(group))
        except PciError:
            return frozenset()

    def group_of(self, address: str) -> int | None:
        """A function's IOMMU group now (None: no such function, or no IOMMU)."""
        try:
            return self.pci.function(address).iommu_group
        except PciError:
            return None

    def _move(self, address: str, driver: str) -> None:
        """One function to the vfio driver (override first, so nothing else probes it once unbound)."""
        current = self._function(address).driver
        if current == driver:
            return
        self._write(lambda: self.pci.set_driver_override(address, driver))
        self.faults.reached("vfio:after-override")
        if current is not None:
            self._write(lambda: self.pci.unbind(address, current))
            self.faults.reached("vfio:after-unbind")
        self._write(lambda: self.pci.bind(address, driver))
        self.faults.reached("vfio:after-bind")

    # --- restore ---------------------------------------------------------------------------------

    def restore(self, gpu_uuid: str | None, record: VfioRecord) -> None:
        """Every recorded function back to its own driver, then persistence mode. Idempotent; raises PrepareError
        (with every function bound to some driver) when a function cannot be rebound."""
        failed: list[str] = []
        for function in record.functions:  # the GPU first: a consumer's driver wants its supplier bound
            if function.driver is None:
                continue  # found on vfio when the record was rebuilt: left where it is
            try:
                self._restore_one(function.address, function.driver, record.driver)
            except PciError as exc:
                failed.append(f"{function.address}: {exc}")
        if failed:
            raise PrepareError(
                "rebinding the passed-through GPU's functions failed (each is bound to a driver; the plugin retries): "
                + "; ".join(failed)
            )
        persistent = [(gpu_uuid, record.address)] if record.persistence_mode and gpu_uuid is not None else []
        for other in record.functions[1:]:
            if other.persistence_mode and (uuid := self._nvml_uuid(other.address)) is not None:
                persistent.append((uuid, other.address))  # another GPU of the group, back on nvidia
        for uuid, address in persistent:
            try:
                if not self.nvml.persistence_mode(uuid):
                    self.nvml.set_persistence_mode(uuid, True)
            except NvmlError as exc:
                raise PrepareError(f"restoring persistence mode on {address} failed: {exc}") from exc
        if record.persistence_mode and gpu_uuid is not None:
            self.faults.reached("vfio:after-persistence-restore")
        log.info("GPU rebound from vfio", address=record.address, functions=[f.address for f in record.functions])

    def _restore_one(self, address: str, original: str, vfio_driver: str) -> None:
        function = self.pci.function(address)
        if function.driver == original:
            if function.driver_override is not None:
                self.pci.set_driver_override(address, None)
            return
        self.pci.set_driver_override(address, original)
        self.faults.reached("vfio:after-restore-override")
        if function.driver is not None:
            self.pci.unbind(address, function.driver)
            self.faults.reached("vfio:after-restore-unbind")
        try:
            self.pci.bind(address, original)
        except PciError:
            # Never bound to no driver: back to vfio (where a VM could not use it without a claim) and fail.
            self.pci.set_driver_override(address, vfio_driver)
            self.pci.bind(address, vfio_driver)
            raise
        self.faults.reached("vfio:after-restore-bind")
        self.pci.set_driver_override(address, None)

    # --- verify ----------------------------------------------------------------------------------

    def problems(self, record: VfioRecord) -> list[str]:
        """What no longer matches a prepared passthrough."""
        if not record.started:
            return [f"the passthrough of {record.address} was never completed"]
        out = []
        for function in record.functions:
            try:
                now = self.pci.function(function.address).driver
            except PciError as exc:
                out.append(f"PCI function {function.address} is gone ({exc})")
                continue
            if now != record.driver:
                out.append(
                    f"PCI function {function.address} of the passed-through GPU is bound to {now or 'no driver'}, "
                    f"not {record.driver}"
                )
        return out

    def rebind(self, device: AllocatableDevice, record: VfioRecord) -> VfioRecord:
        """Repair: move what left the vfio driver back to it (the GPU must be idle again)."""
        gpu = self._function(record.address)
        if gpu.driver == NVIDIA_DRIVER:
            self.refuse_busy(device, gpu)
        for function in reversed(record.functions):
            self._move(function.address, record.driver)
        bound = self._function(record.address)
        return replace(record, vfio_dev=bound.vfio_dev if record.iommufd else None)

    # --- plumbing --------------------------------------------------------------------------------

    def _function(self, address: str) -> PciFunction:
        try:
            return self.pci.function(address)
        except PciError as exc:
            raise PrepareError(str(exc)) from exc

    @staticmethod
    def _write(write: Callable[[], None]) -> None:
        try:
            write()
        except PciError as exc:
            raise PrepareError(str(exc)) from exc

