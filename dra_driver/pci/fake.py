"""`FakePciSysfs`: the PciSysfs of a fake node, over the PCI part of its state (dra_driver/nvml/fake/pci.py holds
the kernel's rules). The state lives where the fake GPUs' does (memory, or the state file shared between the
plugin and the tests), so a rebind is seen by every process, and by the fake NVML: a GPU not bound to nvidia
is not in its device list."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TypeVar

from dra_driver.nvml.fake import pci as rules
from dra_driver.nvml.fake.node import NodeSpec
from dra_driver.nvml.fake.state import FakeNodeState
from dra_driver.nvml.fake.store import StateStore
from dra_driver.pci.model import PciError, PciFunction, modalias, module_names, sys_module_name, vfio_variant

T = TypeVar("T")


class FakePciSysfs:
    def __init__(self, store: StateStore, node: NodeSpec) -> None:
        self._store = store
        self._node = node
        self._aliases = "\n".join(node.pci.modules_alias)

    def _pci(self, state: FakeNodeState) -> rules.PciState:
        return state.pci if state.pci is not None else self._node.initial_pci()

    def state(self) -> rules.PciState:
        return self._pci(self._store.snapshot())

    def _change(self, what: str, change: Callable[[rules.PciState], tuple[rules.PciState, T]]) -> T:
        def apply(state: FakeNodeState) -> tuple[FakeNodeState, T]:
            try:
                new, result = change(self._pci(state))
            except rules.FakePciError as exc:
                raise PciError(f"{what} failed: {exc} (errno {exc.errno})", errno=exc.errno) from None
            return replace(state, pci=new), result

        return self._store.update(apply)

    # --- reads -----------------------------------------------------------------------------------

    def function(self, address: str) -> PciFunction:
        try:
            f = self.state().function(address)
        except rules.FakePciError as exc:
            raise PciError(str(exc), errno=exc.errno) from None
        return PciFunction(
            address=f.address,
            driver=f.driver,
            driver_override=f.driver_override,
            iommu_group=f.iommu_group,
            class_code=f.class_code,
            vendor=f.vendor,
            device=f.device,
            modalias=modalias(f.vendor, f.device, f.vendor, 0, f.class_code),
            vfio_dev=f"vfio{f.vfio_dev}" if f.vfio_dev is not None else None,
            consumers=f.consumers,
        )

    def group_functions(self, group: int) -> tuple[str, ...]:
        return tuple(sorted(f.address for f in self.state().functions if f.iommu_group == group))

    def iommu_enabled(self) -> bool:
        return self.state().iommu

    def iommufd_present(self) -> bool:
        return self.state().iommufd

    def vfio_variant(self, address: str) -> str:
        return vfio_variant(self.function(address).modalias, self._aliases)

    def module_loaded(self, module: str) -> bool:
        return sys_module_name(module) in self.state().modules

    def driver_name(self, module: str) -> str | None:
        if not self.module_loaded(module):
            return None
        return module_names(module)[-1]  # a module registers its driver with `-` (vfio_pci: vfio-pci)

    # --- writes ----------------------------------------------------------------------------------

    def set_driver_override(self, address: str, driver: str | None) -> None:
        self._change(f"setting driver_override of {address}", lambda p: (rules.set_override(p, address, driver), None))

    def unbind(self, address: str, driver: str) -> None:
        gpu = next((g for g in self._node.gpus if g.bus_id == address), None)

        def apply(state: FakeNodeState) -> tuple[FakeNodeState, None]:
            try:
                pci = rules.unbind(self._pci(state), address, driver)
            except rules.FakePciError as exc:
                raise PciError(f"unbinding {address} from {driver} failed: {exc} (errno {exc.errno})",
                               errno=exc.errno) from None
            state = replace(state, pci=pci)
            if gpu is not None and driver == rules.NVIDIA:
                # Persistence mode is the nvidia driver's state of the GPU: it goes with the driver.
                state = state.with_gpu(replace(state.gpu(gpu.uuid), persistence_mode=False))
            return state, None

        self._store.update(apply)

    def bind(self, address: str, driver: str) -> None:
        def apply(state: FakeNodeState) -> tuple[FakeNodeState, rules.FakePciError | None]:
            pci, error = rules.bind(self._pci(state), address, driver, self._pci(state).modules)
            return replace(state, pci=pci), error

        error = self._store.update(apply)
        if error is not None:
            raise PciError(f"binding {address} to {driver} failed: {error} (errno {error.errno})", errno=error.errno)

    def load_module(self, module: str) -> None:
        aliases = self._node.pci.modules_alias
        self._change(f"modprobe {module}", lambda p: (rules.load_module(p, module, aliases), None))

    # --- test hooks (not part of PciSysfs) -------------------------------------------------------

    def inject_bind_fault(self, address: str, driver: str) -> None:
        """Every bind of `address` to `driver` now fails its probe (EIO), leaving the function unbound."""
        fault = rules.BindFault(address, driver)
        self._change("injecting a fault", lambda p: (replace(p, faults=tuple({*p.faults, fault})), None))

    def clear_bind_faults(self) -> None:
        self._change("clearing faults", lambda p: (replace(p, faults=()), None))

    def set_iommu(self, enabled: bool) -> None:
        self._change("setting the IOMMU", lambda p: (replace(p, iommu=enabled), None))
