"""The CDI specs the device plugin's Allocate answers name: one per container allocation, as a claim's spec is.

`<cdi-root>/k8s.<driver>-deviceplugin_<node>_<key>.json`, kind `k8s.<driver>/deviceplugin`, one CDI device per GPU
named `<key>-gpu-<minor>`, with the same edits a DRA claim of those GPUs gets (the GPU plugin's edits builder:
device nodes, driver files and hooks on real GPUs; the descriptive env on fake ones), so a container sees the same
thing through either API. `key` is a digest of the allocation's GPU UUIDs: the kubelet may call Allocate again for
the same devices (a restarted pod) and gets the same names. The class differs from the claims' (`claim`), so the
DRA side's sweep of claim specs never takes one of these, and this module's sweep never takes a claim's.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from dra_driver.cdi.errors import CdiSpecError
from dra_driver.cdi.model import ContainerEdits, Device, Spec
from dra_driver.cdi.names import qualified_name
from dra_driver.cdi.version import minimum_version
from dra_driver.cdi.writer import CDI_ROOT_HINT, node_claim_spec_name, node_claim_spec_uid, remove_spec, write_spec
from dra_driver.fsutil import explain_os_error, temp_file_pattern
from dra_driver.inventory.catalog import AllocatableDevice

SPEC_CLASS = "deviceplugin"
_KEY_LENGTH = 20  # hex digits of sha256: collisions among a node's allocations are out of the question
_TEMP = temp_file_pattern(r"(?P<target>.+)")

# The GPU plugin's edits for these whole GPUs used together: (each device's edits, the spec-wide edits).
SpecEdits = Callable[[Sequence[AllocatableDevice]], tuple[tuple[ContainerEdits, ...], ContainerEdits]]


def allocation_key(uuids: Sequence[str]) -> str:
    return hashlib.sha256(",".join(sorted(set(uuids))).encode()).hexdigest()[:_KEY_LENGTH]


class AllocationSpecs:
    """The only writer of the device plugin's CDI files."""

    def __init__(self, cdi_root: Path, driver_name: str, node_name: str, edits: SpecEdits) -> None:
        self.cdi_root = cdi_root
        self.vendor = f"k8s.{driver_name}"
        self.node_name = node_name
        self._edits = edits

    def file_name(self, key: str) -> str:
        return node_claim_spec_name(self.vendor, SPEC_CLASS, self.node_name, key)

    def write(self, key: str, gpus: Sequence[AllocatableDevice]) -> list[str]:
        """Write the allocation's spec; returns the fully-qualified CDI names, in the order of `gpus`."""
        device_edits, spec_edits = self._edits(gpus)
        devices = tuple(Device(name=f"{key}-{g.name}", container_edits=e) for g, e in zip(gpus, device_edits,
                                                                                          strict=True))
        spec = Spec(cdi_version="0.3.0", kind=f"{self.vendor}/{SPEC_CLASS}", devices=devices,
                    container_edits=spec_edits)  # fmt: skip
        spec = Spec(cdi_version=minimum_version(spec), kind=spec.kind, devices=spec.devices,
                    container_edits=spec.container_edits)  # fmt: skip
        try:
            write_spec(self.cdi_root, self.file_name(key), spec)
        except OSError as exc:
            path = self.cdi_root / self.file_name(key)
            raise CdiSpecError(explain_os_error(exc, path, "writing the CDI spec", CDI_ROOT_HINT)) from exc
        return [qualified_name(self.vendor, SPEC_CLASS, d.name) for d in devices]

    def remove(self, key: str) -> bool:
        if not os.path.lexists(self.cdi_root / self.file_name(key)):
            return False
        try:
            return remove_spec(self.cdi_root, self.file_name(key))
        except OSError as exc:
            path = self.cdi_root / self.file_name(key)
            raise CdiSpecError(explain_os_error(exc, path, "removing the CDI spec", CDI_ROOT_HINT)) from exc

    def keys_on_disk(self) -> set[str]:
        """The allocation keys of this driver's and node's device-plugin specs in the CDI dir."""
        if not self.cdi_root.is_dir():
            return set()
        return {key for path in self.cdi_root.iterdir() if (key := self._key(path.name)) is not None}

    def is_temp_file(self, name: str) -> bool:
        """A temp file of one of these specs (`.<spec file>.<random>.tmp`), as a crash mid-write leaves it; never
        a claim's, another driver's or another node's."""
        match = _TEMP.fullmatch(name)
        return match is not None and self._key(match["target"]) is not None

    def _key(self, file_name: str) -> str | None:
        key = node_claim_spec_uid(file_name, self.vendor, SPEC_CLASS, self.node_name)
        ours = key is not None and len(key) == _KEY_LENGTH and all(c in "0123456789abcdef" for c in key)
        return key if ours else None
