"""`PciSysfs`: reading and re-binding PCI functions, and `HostPciSysfs`, the real one over a sysfs root.

Paths (root `/sys` on a node; tests point it at a tree of plain files):
    bus/pci/devices/<bdf>/{driver -> ../../../bus/pci/drivers/<drv>, driver_override, iommu_group -> …/<g>,
                           class, vendor, device, modalias, sriov_numvfs, vfio-dev/vfio<N>, consumer:pci:<bdf2>}
    bus/pci/drivers/<drv>/{bind, unbind}
    kernel/iommu_groups/<g>/devices/<bdf>
    module/<module>
Every write is one `write(2)` of exactly the bytes the kernel expects (a bdf, a driver name, "\n"), so a driver's
store function sees the whole value at once. Modules are loaded with `modprobe <module>` (an argv list).
"""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

from dra_driver.pci.model import PciError, PciFunction, module_names, sys_module_name, vfio_variant

DEFAULT_SYSFS = Path("/sys")
DEFAULT_DEV = Path("/dev")
MODPROBE_TIMEOUT_S = 30.0
CONSUMER = "consumer:pci:"  # a device link to a function that depends on this one (a VGA GPU's audio function)


@runtime_checkable
class PciSysfs(Protocol):
    def function(self, address: str) -> PciFunction:
        """One function as it is now. Raises PciError when there is no such function."""

    def group_functions(self, group: int) -> tuple[str, ...]:
        """Every function of an IOMMU group, sorted."""

    def set_driver_override(self, address: str, driver: str | None) -> None:
        """Write `driver` (None: clear it with "\\n") to the function's driver_override."""

    def unbind(self, address: str, driver: str) -> None:
        """Detach the function from `driver` (raises PciError(ENODEV) when it is not bound to it)."""

    def bind(self, address: str, driver: str) -> None:
        """Attach the unbound function to `driver` (raises PciError; a failed probe leaves it unbound)."""

    def iommu_enabled(self) -> bool:
        """/sys/kernel/iommu_groups holds at least one group."""

    def iommufd_present(self) -> bool:
        """/dev/iommu exists (the kernel has IOMMUFD)."""

    def vfio_variant(self, address: str) -> str:
        """The vfio-pci module that serves this function best (modules.alias), else `vfio-pci`."""

    def module_loaded(self, module: str) -> bool: ...

    def load_module(self, module: str) -> None:
        """`modprobe <module>`; raises PciError."""

    def driver_name(self, module: str) -> str | None:
        """The driver a loaded module registered under bus/pci/drivers (tries `_` as `-`), None if none."""


def _os_error(action: str, path: Path, exc: OSError, hint: str) -> PciError:
    return PciError(f"{action} {path} failed: {exc.strerror or exc} (errno {exc.errno}); {hint}", errno=exc.errno)


class HostPciSysfs:
    """The node's sysfs. `sys_root`: where this process sees the host's /sys; `modules_alias`: the running
    kernel's modules.alias; `modprobe`: the argv prefix that loads a module on the host."""

    def __init__(
        self,
        sys_root: Path = DEFAULT_SYSFS,
        *,
        dev_root: Path = DEFAULT_DEV,
        modules_alias: Path | None = None,
        modprobe: Sequence[str] = ("modprobe",),
    ) -> None:
        self.sys_root = sys_root
        self.dev_root = dev_root
        self.modules_alias = modules_alias or Path("/lib/modules") / os.uname().release / "modules.alias"
        self.modprobe = tuple(modprobe)

    def _device(self, address: str) -> Path:
        return self.sys_root / "bus/pci/devices" / address

    def _driver_dir(self, driver: str) -> Path:
        return self.sys_root / "bus/pci/drivers" / driver

    def function(self, address: str) -> PciFunction:
        base = self._device(address)
        if not base.is_dir():
            raise PciError(f"no PCI function {address}: {base} does not exist", errno=errno.ENODEV)
        override = self._text(base / "driver_override")
        return PciFunction(
            address=address,
            driver=_link_name(base / "driver"),
            driver_override=None if override in (None, "", "(null)") else override,
            iommu_group=_int(_link_name(base / "iommu_group"), 10),
            class_code=_int(self._text(base / "class"), 16) or 0,
            vendor=_int(self._text(base / "vendor"), 16) or 0,
            device=_int(self._text(base / "device"), 16) or 0,
            modalias=self._text(base / "modalias") or "",
            vfio_dev=_first(base / "vfio-dev", "vfio"),
            consumers=tuple(sorted(p.name[len(CONSUMER) :] for p in _entries(base) if p.name.startswith(CONSUMER))),
            sriov_numvfs=_int(self._text(base / "sriov_numvfs"), 10) or 0,
        )

    def group_functions(self, group: int) -> tuple[str, ...]:
        return tuple(sorted(p.name for p in _entries(self.sys_root / "kernel/iommu_groups" / str(group) / "devices")))

    def set_driver_override(self, address: str, driver: str | None) -> None:
        self._write(self._device(address) / "driver_override", f"{driver}" if driver else "\n", "setting")

    def unbind(self, address: str, driver: str) -> None:
        self._write(self._driver_dir(driver) / "unbind", address, "unbinding")

    def bind(self, address: str, driver: str) -> None:
        self._write(self._driver_dir(driver) / "bind", address, "binding")

    def iommu_enabled(self) -> bool:
        return any(True for _ in _entries(self.sys_root / "kernel/iommu_groups"))

    def iommufd_present(self) -> bool:
        return os.path.exists(self.dev_root / "iommu")

    def vfio_variant(self, address: str) -> str:
        try:
            aliases = self.modules_alias.read_text()
        except OSError:
            aliases = ""  # no modules.alias (a minimal image): vfio-pci itself
        return vfio_variant(self.function(address).modalias, aliases)

    def module_loaded(self, module: str) -> bool:
        return (self.sys_root / "module" / sys_module_name(module)).is_dir()

    def load_module(self, module: str) -> None:
        argv = [*self.modprobe, module]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=MODPROBE_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise PciError(f"loading kernel module {module} ({' '.join(argv)}) failed: {exc}") from exc
        if done.returncode != 0:
            raise PciError(
                f"loading kernel module {module} ({' '.join(argv)}) failed with exit status {done.returncode}: "
                f"{done.stderr.strip() or done.stdout.strip()}; load it on the node (modprobe {module})"
            )

    def driver_name(self, module: str) -> str | None:
        return next((name for name in module_names(module) if self._driver_dir(name).is_dir()), None)

    def _text(self, path: Path) -> str | None:
        try:
            return path.read_text().strip()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise _os_error("reading", path, exc, "the plugin needs read access to the host's /sys") from exc

    def _write(self, path: Path, value: str, action: str) -> None:
        write_attribute(path, value, action)


def write_attribute(path: Path, value: str, action: str) -> None:
    """One `write(2)` of `value` to a sysfs attribute, as `echo >` does; raises PciError with the kernel's errno."""
    data = value.encode()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC)  # as `echo >` opens it
    except OSError as exc:
        raise _os_error(action, path, exc, "the plugin needs /sys mounted read-write (privileged)") from exc
    try:
        written = os.write(fd, data)
    except OSError as exc:
        raise _os_error(f"{action} ({value.strip() or 'clear'})", path, exc, "see the kernel log (dmesg)") from exc
    finally:
        os.close(fd)
    if written != len(data):
        raise PciError(f"{action} {path}: short write ({written} of {len(data)} bytes)", errno=errno.EIO)


def _link_name(path: Path) -> str | None:
    try:
        return os.path.basename(os.readlink(path))
    except OSError:
        return None


def _int(text: str | None, base: int) -> int | None:
    if text is None:
        return None
    try:
        return int(text, base)
    except ValueError:
        return None


def _entries(path: Path) -> list[Path]:
    try:
        return list(path.iterdir())
    except OSError:
        return []


def _first(path: Path, prefix: str) -> str | None:
    names = sorted(p.name for p in _entries(path) if p.name.startswith(prefix))
    return names[0] if names else None
