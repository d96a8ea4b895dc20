"""The PciSysfs of the node an NVML backend drives: the fake node's PCI state for a fake backend, the host's
sysfs otherwise (as `open_mps_control` picks the MPS control)."""

from __future__ import annotations

import sys
from pathlib import Path

from dra_driver.nvml.backend import NvmlBackend
from dra_driver.nvml.factory import FAKE_BACKEND_MODULE
from dra_driver.pci.sysfs import DEFAULT_DEV, DEFAULT_SYSFS, HostPciSysfs, PciSysfs
from dra_driver.pci.vgpu import HostVgpuSysfs, VgpuSysfs


def open_pci_sysfs(backend: NvmlBackend, *, sys_root: Path = DEFAULT_SYSFS, dev_root: Path = DEFAULT_DEV) -> PciSysfs:
    # Looked up in sys.modules: the real path never imports the fake just to learn the backend is not one.
    fake = sys.modules.get(FAKE_BACKEND_MODULE)
    if fake is not None and isinstance(backend, fake.FakeNvml):
        pci: PciSysfs = backend.pci_sysfs()
        return pci
    return HostPciSysfs(sys_root, dev_root=dev_root)


def open_vgpu_sysfs(backend: NvmlBackend, *, sys_root: Path = DEFAULT_SYSFS) -> VgpuSysfs:
    """The GPUs' SR-IOV virtual functions and their vGPU types: the fake node's for a fake backend, the host's
    sysfs otherwise."""
    fake = sys.modules.get(FAKE_BACKEND_MODULE)
    if fake is not None and isinstance(backend, fake.FakeNvml):
        vgpu: VgpuSysfs = backend.vgpu_sysfs()
        return vgpu
    return HostVgpuSysfs(sys_root)
