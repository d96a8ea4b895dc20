"""What a PCI function is to the passthrough code, and the pure rules around it (no I/O).

Facts (Linux sysfs ABI, `Documentation/ABI/testing/sysfs-bus-pci`; `drivers/pci/pci-driver.c`,
`drivers/base/bus.c`; docs/reference/passthrough.md):
- a function's driver is the basename of `/sys/bus/pci/devices/<bdf>/driver`; its IOMMU group the basename of
  `iommu_group`; `class`, `vendor`, `device` are hex text (`0x030200`), `modalias` is
  `pci:v<vendor:8>d<device:8>sv<sub:8>sd<sub:8>bc<class:2>sc<sub:2>i<prog-if:2>`;
- writing a driver name to `driver_override` makes the function match that driver only; writing "\n" clears it;
- a driver's `bind` attaches an unbound function that matches it (else ENODEV; EBUSY when bound); a probe that
  fails leaves the function unbound; `unbind` detaches it from that driver only (else ENODEV);
- vfio-pci variant drivers declare `vfio_pci:` aliases in `modules.alias`; a device whose modalias matches one is
  best served by that module; otherwise `vfio-pci`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fnmatch import fnmatchcase

NVIDIA_DRIVER = "nvidia"
VFIO_PCI = "vfio-pci"
VFIO_PCI_MODULE = "vfio_pci"
VFIO_ALIAS_PREFIX = "vfio_pci:"

PCI_CLASS_VGA = 0x030000  # display controller, VGA-compatible (a GPU with display outputs)
PCI_CLASS_3D = 0x030200  # display controller, 3D (datacenter GPUs)
PCI_CLASS_AUDIO = 0x040300  # multimedia, HD audio (the audio function of a VGA GPU)
NVIDIA_VENDOR = 0x10DE

_BDF = re.compile(r"^(?:([0-9a-fA-F]{4,8}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")
_CLASS_PREFIX = re.compile(r"^0x([0-9a-f]{2}|[0-9a-f]{4}|[0-9a-f]{6})$")
# A kernel driver's name as /sys/bus/pci/drivers lists it (module names use `_`, driver names also `-`).
_DRIVER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
REBIND_FLAG = "--passthrough-allow-rebind"


class PciError(Exception):
    """A sysfs read or write failed; names the path, the kernel's answer and what to do."""

    def __init__(self, message: str, *, errno: int | None = None) -> None:
        super().__init__(message)
        self.errno = errno


def pci_address(bus_id: str) -> str:
    """A PCI bus id in sysfs form: NVML's "00000000:1B:00.0" and "1b:00.0" both become "0000:1b:00.0"."""
    match = _BDF.match(bus_id.strip())
    if match is None:
        raise ValueError(f"not a PCI address: {bus_id!r} (expected e.g. 0000:1b:00.0)")
    domain, bus, device, function = match.groups()
    return f"{int(domain or '0', 16):04x}:{bus.lower()}:{device.lower()}.{function}"


def is_vfio_driver(driver: str | None) -> bool:
    """vfio-pci itself or one of its variant drivers (e.g. nvgrace-gpu-vfio-pci)."""
    return driver is not None and (driver == VFIO_PCI or driver.endswith("-vfio-pci") or driver.endswith("_vfio_pci"))


def is_display_class(class_code: int) -> bool:
    return class_code >> 16 == 0x03


def is_vga_class(class_code: int) -> bool:
    return class_code >> 8 == PCI_CLASS_VGA >> 8


@dataclass(frozen=True)
class PciFunction:
    """One PCI function as read from sysfs."""

    address: str  # "0000:1b:00.0"
    driver: str | None  # bound driver, None: unbound
    driver_override: str | None  # None: not set ("(null)")
    iommu_group: int | None  # None: no IOMMU (or not in a group)
    class_code: int
    vendor: int
    device: int
    modalias: str
    vfio_dev: str | None = None  # "vfio3" when bound to a vfio driver with IOMMUFD cdev support
    consumers: tuple[str, ...] = ()  # addresses of `consumer:pci:<bdf>` links (a VGA GPU's audio function)
    sriov_numvfs: int = 0


def slot_of(address: str) -> str:
    """`0000:1b:00.1` -> `0000:1b:00`: the PCI device (slot) a function belongs to."""
    return address.rsplit(".", 1)[0]


def is_nvidia_gpu(function: PciFunction) -> bool:
    """An NVIDIA display controller (VGA or 3D): a GPU, as opposed to its audio or USB function or a host device."""
    return function.vendor == NVIDIA_VENDOR and is_display_class(function.class_code)


@dataclass(frozen=True)
class RebindAllowance:
    """Which host functions an admin lets a passthrough move to vfio-pci (`--passthrough-allow-rebind`): a function
    of the GPU's IOMMU group that is neither the GPU's own (same slot, or its consumer) nor another NVIDIA GPU,
    e.g. a NIC behind the same PCIe switch without ACS. Matched by PCI class code prefix (`0x02`: every network
    controller, `0x0200`: Ethernet, `0x020000`: exactly) or by the driver bound to it (`mlx5_core`). Empty: none."""

    classes: tuple[str, ...] = ()  # lower-case hex digits without 0x: "02", "0200", "020000"
    drivers: tuple[str, ...] = ()

    def allows(self, function: PciFunction) -> bool:
        code = f"{function.class_code:06x}"
        return any(code.startswith(c) for c in self.classes) or (
            function.driver is not None and function.driver in self.drivers
        )

    @property
    def label(self) -> str:
        """As the flag is written."""
        return ",".join([*(f"0x{c}" for c in self.classes), *self.drivers]) or "(none)"


NO_REBIND = RebindAllowance()


def rebind_allowance(text: str, *, flag: str = REBIND_FLAG) -> RebindAllowance:
    """`0x02,0x0c03,mlx5_core` -> RebindAllowance; raises ValueError naming `flag` and the fix."""
    classes: list[str] = []
    drivers: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        if part.lower().startswith("0x"):
            match = _CLASS_PREFIX.match(part.lower())
            if match is None:
                raise ValueError(
                    f"{flag} {text!r}: {part!r} is no PCI class code; write a class as 0x + 2, 4 or 6 hex digits "
                    "(0x02 every network controller, 0x0200 Ethernet, 0x020000 exactly), or name a driver (mlx5_core)"
                )
            classes.append(match.group(1))
        elif _DRIVER_NAME.match(part):
            drivers.append(part)
        else:
            raise ValueError(
                f"{flag} {text!r}: {part!r} is neither a PCI class code (0x0200) nor a kernel driver name (mlx5_core)"
            )
    return RebindAllowance(tuple(dict.fromkeys(classes)), tuple(dict.fromkeys(drivers)))


def modalias(vendor: int, device: int, subsystem_vendor: int, subsystem_device: int, class_code: int) -> str:
    """The kernel's PCI modalias text (drivers/pci/pci-sysfs.c modalias_show)."""
    return (
        f"pci:v{vendor:08X}d{device:08X}sv{subsystem_vendor:08X}sd{subsystem_device:08X}"
        f"bc{class_code >> 16 & 0xFF:02X}sc{class_code >> 8 & 0xFF:02X}i{class_code & 0xFF:02X}"
    )


def vfio_variant(device_modalias: str, modules_alias: str) -> str:
    """The vfio-pci module for a device: the variant whose `vfio_pci:` alias matches its modalias most
    specifically (fewest wildcards, then the longest pattern, then by name), else `vfio-pci`.

    `modules_alias` is the text of `/lib/modules/<kver>/modules.alias` (`alias <pattern> <module>` lines)."""
    best: tuple[int, int, str] | None = None
    for line in modules_alias.splitlines():
        parts = line.split()
        if len(parts) != 3 or parts[0] != "alias" or not parts[1].startswith(VFIO_ALIAS_PREFIX):
            continue
        pattern = "pci:" + parts[1][len(VFIO_ALIAS_PREFIX) :]
        if not fnmatchcase(device_modalias, pattern):
            continue
        rank = (pattern.count("*"), -len(pattern), parts[2])
        if best is None or rank < best:
            best = rank
    return best[2] if best is not None else VFIO_PCI


def module_names(module: str) -> tuple[str, ...]:
    """The driver directory names a module may register under /sys/bus/pci/drivers: the name as given, then with
    `_` as `-` (module vfio_pci registers driver vfio-pci)."""
    dashed = module.replace("_", "-")
    return (module,) if dashed == module else (module, dashed)


def sys_module_name(module: str) -> str:
    """/sys/module/<name> spells every module with `_`."""
    return module.replace("-", "_")
