"""The fake node's PCI functions and IOMMU groups, with the kernel's bind/unbind rules (pure functions on values).

Every fake GPU is a PCI function at its bus id in an IOMMU group of its own, bound to `nvidia`; a VGA-class GPU
(node file `pci_class: vga`) has an HD-audio function `.1` in the same group, bound to `snd_hda_intel` and linked
as the GPU's consumer. The node file's `pci` block turns the IOMMU off, sets group numbers, adds functions to a
GPU's group, declares vfio-pci variant aliases and injects bind faults (docs/fake-nvml.md, "PCI and VFIO").

The rules are the kernel's (drivers/base/bus.c bind_store/unbind_store, drivers/pci/pci-driver.c
pci_match_device): a driver binds a function only when it is unbound (EBUSY otherwise) and matches it
(driver_override names exactly that driver, or, without an override, the driver is the function's own native
driver: vfio drivers match by override only) else ENODEV; a probe that fails (an injected fault) leaves the
function unbound; unbind succeeds only from the driver it is bound to. Unbinding `nvidia` drops the GPU's
persistence mode (driver state) — the NVML side (backend.py) sees a GPU not bound to nvidia as gone.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from dra_driver.nvml.fake import docread as dr
from dra_driver.pci.model import pci_address

NVIDIA = "nvidia"
HDA_AUDIO = "snd_hda_intel"
CLASS_VGA = 0x030000
CLASS_3D = 0x030200
CLASS_AUDIO = 0x040300
NVIDIA_VENDOR = 0x10DE
AUDIO_DEVICE = 0x22BA  # an NVIDIA HD-audio function's device id
FIRST_GROUP = 20  # default group number of GPU 0 (groups below belong to bridges on a real host)
VFIO_MODULES = ("vfio_pci",)


class FakePciError(Exception):
    """What the kernel would answer a sysfs write with (an errno)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.errno = code


@dataclass(frozen=True)
class PciFunctionState:
    """One PCI function of the fake sysfs: identity, IOMMU group and the driver bound now."""

    address: str
    class_code: int
    vendor: int
    device: int
    native_driver: str | None  # the driver its id table matches (what the node booted it with)
    iommu_group: int | None
    driver: str | None
    driver_override: str | None = None
    consumers: tuple[str, ...] = ()
    vfio_dev: int | None = None  # N of /dev/vfio/devices/vfioN while bound to a vfio driver


@dataclass(frozen=True)
class BindFault:
    """Binding `address` to `driver` fails its probe (EIO), leaving the function unbound."""

    address: str
    driver: str


@dataclass(frozen=True)
class PciState:
    """The fake sysfs's PCI functions and whether the IOMMU (and iommufd) is on."""

    functions: tuple[PciFunctionState, ...]  # sorted by address
    iommu: bool = True
    iommufd: bool = True
    modules: tuple[str, ...] = ()  # loaded vfio modules (`_` spelling)
    faults: tuple[BindFault, ...] = ()

    def function(self, address: str) -> PciFunctionState:
        found = next((f for f in self.functions if f.address == address), None)
        if found is None:
            raise FakePciError(errno.ENODEV, f"no PCI function {address}")
        return found

    def with_function(self, new: PciFunctionState) -> PciState:
        return replace(self, functions=tuple(new if f.address == new.address else f for f in self.functions))

    def driver_of(self, address: str) -> str | None:
        found = next((f for f in self.functions if f.address == address), None)
        return found.driver if found is not None else None


# --- node file ---------------------------------------------------------------------------------


_ADDRESS = dr.string(check=pci_address)


@dataclass(frozen=True)
class PciFunctionDoc:
    """Another function in a GPU's IOMMU group (e.g. a USB-C controller of a workstation card)."""

    address: str
    group_of: str  # the GPU whose group it joins
    class_code: int = 0x0C0330
    vendor: int = NVIDIA_VENDOR
    device: int = 0x1AD8
    driver: str | None = "xhci_hcd"

    _FIELDS: ClassVar = (
        dr.Field("address", _ADDRESS),
        dr.Field("group_of", _ADDRESS),
        dr.Field("class_code", dr.integer(0, 0xFFFFFF), 0x0C0330),
        dr.Field("vendor", dr.integer(0, 0xFFFF), NVIDIA_VENDOR),
        dr.Field("device", dr.integer(0, 0xFFFF), 0x1AD8),
        dr.Field("driver", dr.nullable(dr.NON_EMPTY), "xhci_hcd"),
    )

    @classmethod
    def read(cls, value: object, path: str) -> PciFunctionDoc:
        return cls(**dr.fields(value, path, cls._FIELDS))


_BIND_FAULT_FIELDS = (dr.Field("address", _ADDRESS), dr.Field("driver", dr.NON_EMPTY, "vfio-pci"))


def _bind_fault(value: object, path: str) -> BindFault:
    return BindFault(**dr.fields(value, path, _BIND_FAULT_FIELDS))


@dataclass(frozen=True)
class PciGpu:
    """What the PCI side needs of a GPU slot."""

    address: str
    device: int  # PCI device id
    vga: bool


@dataclass(frozen=True)
class PciSpec:
    """The node file's `pci` block, resolved."""

    iommu: bool = True
    iommufd: bool = True
    groups: tuple[tuple[str, int], ...] = ()
    functions: tuple[PciFunctionDoc, ...] = ()
    modules_alias: tuple[str, ...] = ()
    faults: tuple[BindFault, ...] = ()


NO_PCI_SPEC = PciSpec()  # a node file without a `pci` block

_PCI_FIELDS = (
    dr.Field("iommu", dr.choice("on", "off"), "on"),
    dr.Field("iommufd", dr.boolean, True),  # /dev/iommu exists
    dr.Field("groups", dr.mapping(_ADDRESS, dr.NON_NEGATIVE), {}),  # GPU bus id -> IOMMU group number
    dr.Field("functions", dr.items(PciFunctionDoc.read), ()),
    dr.Field("modules_alias", dr.items(dr.NON_EMPTY), ()),  # extra modules.alias lines, e.g. vfio_pci variant aliases
    dr.Field("bind_faults", dr.items(_bind_fault), ()),
)


def read_pci_spec(value: object, path: str) -> PciSpec:
    """The node file's `pci` block (IOMMU, groups, more functions, faults); raises docread.Rejected."""
    doc = dr.fields(value, path, _PCI_FIELDS)
    return PciSpec(
        iommu=doc["iommu"] == "on",
        iommufd=doc["iommufd"],
        groups=tuple(sorted(doc["groups"].items())),
        functions=doc["functions"],
        modules_alias=doc["modules_alias"],
        faults=doc["bind_faults"],
    )


def audio_address(gpu_address: str) -> str:
    return gpu_address[:-1] + "1"


def initial_pci(spec: PciSpec, gpus: tuple[PciGpu, ...]) -> PciState:
    """The PCI functions of a freshly booted node."""
    groups = dict(spec.groups)
    functions: list[PciFunctionState] = []
    group_of: dict[str, int | None] = {}
    for index, gpu in enumerate(gpus):
        group = groups.get(gpu.address, FIRST_GROUP + index) if spec.iommu else None
        group_of[gpu.address] = group
        consumers = (audio_address(gpu.address),) if gpu.vga else ()
        functions.append(
            PciFunctionState(
                gpu.address, CLASS_VGA if gpu.vga else CLASS_3D, NVIDIA_VENDOR, gpu.device, NVIDIA, group, NVIDIA,
                consumers=consumers,
            )
        )
        if gpu.vga:
            audio = audio_address(gpu.address)
            functions.append(
                PciFunctionState(audio, CLASS_AUDIO, NVIDIA_VENDOR, AUDIO_DEVICE, HDA_AUDIO, group, HDA_AUDIO)
            )
    for extra in spec.functions:
        if extra.group_of not in group_of:
            raise ValueError(f"pci.functions: {extra.address} joins the group of {extra.group_of}, which is no GPU")
        functions.append(
            PciFunctionState(
                extra.address, extra.class_code, extra.vendor, extra.device, extra.driver, group_of[extra.group_of],
                extra.driver,
            )
        )
    addresses = [f.address for f in functions]
    if len(set(addresses)) != len(addresses):
        raise ValueError("pci: two PCI functions at the same address")
    return PciState(
        functions=tuple(sorted(functions, key=lambda f: f.address)),
        iommu=spec.iommu,
        iommufd=spec.iommufd,
        faults=spec.faults,
    )


# --- the kernel's rules ------------------------------------------------------------------------


def _vfio(driver: str) -> bool:
    return driver == "vfio-pci" or driver.endswith("-vfio-pci")


def set_override(state: PciState, address: str, driver: str | None) -> PciState:
    function = state.function(address)
    return state.with_function(replace(function, driver_override=driver or None))


def unbind(state: PciState, address: str, driver: str) -> PciState:
    function = state.function(address)
    if function.driver != driver:
        raise FakePciError(errno.ENODEV, f"{address} is not bound to {driver} (bound to {function.driver or 'none'})")
    return state.with_function(replace(function, driver=None, vfio_dev=None))


def bind(state: PciState, address: str, driver: str, loaded: tuple[str, ...]) -> tuple[PciState, FakePciError | None]:
    """The state after the write and the error the write returns (a failed probe still changes nothing but
    leaves the function unbound, as it was)."""
    function = state.function(address)
    if _vfio(driver) and driver.replace("-", "_") not in loaded:
        return state, FakePciError(errno.ENOENT, f"no driver {driver} (module not loaded)")
    if function.driver is not None:
        return state, FakePciError(errno.EBUSY, f"{address} is already bound to {function.driver}")
    if function.driver_override is not None:
        matches = function.driver_override == driver
    else:
        matches = not _vfio(driver) and driver == function.native_driver
    if not matches:
        why = f"driver_override is {function.driver_override}" if function.driver_override else "no id match"
        return state, FakePciError(errno.ENODEV, f"{driver} does not match {address} ({why})")
    if BindFault(address, driver) in state.faults:
        return state, FakePciError(errno.EIO, f"probe of {address} by {driver} failed (injected fault)")
    vfio_dev = None
    if _vfio(driver):
        taken = {f.vfio_dev for f in state.functions if f.vfio_dev is not None}
        vfio_dev = next(n for n in range(len(taken) + 1) if n not in taken)
    return state.with_function(replace(function, driver=driver, vfio_dev=vfio_dev)), None


def load_module(state: PciState, module: str, aliases: tuple[str, ...]) -> PciState:
    name = module.replace("-", "_")
    known = set(VFIO_MODULES) | {line.split()[-1].replace("-", "_") for line in aliases if len(line.split()) == 3}
    if name not in known:
        raise FakePciError(errno.ENOENT, f"modprobe: FATAL: Module {module} not found")
    return state if name in state.modules else replace(state, modules=tuple(sorted((*state.modules, name))))


# --- state file codec --------------------------------------------------------------------------


def pci_to_dict(state: PciState) -> dict[str, object]:
    return {
        "iommu": state.iommu,
        "iommufd": state.iommufd,
        "modules": list(state.modules),
        "faults": [{"address": f.address, "driver": f.driver} for f in state.faults],
        "functions": [
            {
                "address": f.address,
                "class": f.class_code,
                "vendor": f.vendor,
                "device": f.device,
                "native_driver": f.native_driver,
                "iommu_group": f.iommu_group,
                "driver": f.driver,
                "driver_override": f.driver_override,
                "consumers": list(f.consumers),
                "vfio_dev": f.vfio_dev,
            }
            for f in state.functions
        ],
    }


_OPTIONAL_NAME = dr.nullable(dr.NON_EMPTY)
_FUNCTION_STATE_FIELDS = (
    dr.Field("address", dr.NON_EMPTY),
    dr.Field("class", dr.NON_NEGATIVE),
    dr.Field("vendor", dr.NON_NEGATIVE),
    dr.Field("device", dr.NON_NEGATIVE),
    dr.Field("native_driver", _OPTIONAL_NAME),
    dr.Field("iommu_group", dr.nullable(dr.NON_NEGATIVE)),
    dr.Field("driver", _OPTIONAL_NAME),
    dr.Field("driver_override", _OPTIONAL_NAME),
    dr.Field("consumers", dr.items(dr.NON_EMPTY)),
    dr.Field("vfio_dev", dr.nullable(dr.NON_NEGATIVE)),
)


def _function_state(value: object, path: str) -> PciFunctionState:
    doc: dict[str, Any] = dr.fields(value, path, _FUNCTION_STATE_FIELDS)
    doc["class_code"] = doc.pop("class")
    return PciFunctionState(**doc)


def _fault(value: object, path: str) -> BindFault:
    return BindFault(**dr.fields(value, path, (dr.Field("address", dr.NON_EMPTY), dr.Field("driver", dr.NON_EMPTY))))


_PCI_STATE_FIELDS = (
    dr.Field("iommu", dr.boolean),
    dr.Field("iommufd", dr.boolean),
    dr.Field("modules", dr.items(dr.NON_EMPTY)),
    dr.Field("faults", dr.items(_fault)),
    dr.Field("functions", dr.items(_function_state)),
)


def read_pci_state(value: object, path: str) -> PciState:
    """The state file's `pci` block; raises docread.Rejected."""
    doc = dr.fields(value, path, _PCI_STATE_FIELDS)
    return PciState(
        functions=tuple(sorted(doc["functions"], key=lambda f: f.address)),
        iommu=doc["iommu"],
        iommufd=doc["iommufd"],
        modules=doc["modules"],
        faults=doc["faults"],
    )
