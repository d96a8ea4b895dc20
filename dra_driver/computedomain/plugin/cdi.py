"""The compute-domain plugin's per-claim CDI specs: `<cdi-root>/k8s.compute-domain.gpu.dra.dev-claim_<node>_<uid>.json`,
kind `k8s.compute-domain.gpu.dra.dev/claim`, one CDI device `<claimUID>-<device>` per prepared device, written
atomically (0644) with the lowest cdiVersion that covers it. The edits of each device are its effect's
(effects/imex_channel.py, effects/daemon_dir.py); this module only names, writes, compares and removes files.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from dra_driver.cdi.errors import CdiSpecError
from dra_driver.cdi.model import ContainerEdits, Device, Spec
from dra_driver.cdi.names import qualified_name
from dra_driver.cdi.version import minimum_version
from dra_driver.cdi.writer import (
    CDI_ROOT_HINT,
    node_claim_spec_name,
    node_claim_spec_uid,
    remove_spec,
    spec_file_problem,
    write_spec,
)
from dra_driver.fsutil import explain_os_error, sweep_temp_files, temp_file_pattern
from dra_driver.kubeletplugin.names import uid_problem

CLAIM_CLASS = "claim"


class SpecFiles:
    def __init__(self, cdi_root: Path, driver_name: str, node_name: str) -> None:
        self.cdi_root = cdi_root
        self.vendor = f"k8s.{driver_name}"
        self._node = node_name
        self._temp_re = temp_file_pattern(r"(?P<target>.+)")

    def file_name(self, uid: str) -> str:
        """The node name is shortened where the name would pass the 255-byte limit (`node_claim_spec_name`)."""
        return node_claim_spec_name(self.vendor, CLAIM_CLASS, self._node, uid)

    def _claim_uid(self, file_name: str) -> str | None:
        uid = node_claim_spec_uid(file_name, self.vendor, CLAIM_CLASS, self._node)
        return uid if uid is not None and uid_problem(uid) is None else None

    def path(self, uid: str) -> Path:
        return self.cdi_root / self.file_name(uid)

    def cdi_id(self, uid: str, device: str) -> str:
        return qualified_name(self.vendor, CLAIM_CLASS, f"{uid}-{device}")

    def spec(self, uid: str, edits: Mapping[str, ContainerEdits]) -> Spec:
        """`edits`: device name -> its edits, in the claim's device order."""
        devices = tuple(Device(name=f"{uid}-{name}", container_edits=e) for name, e in edits.items())
        spec = Spec(cdi_version="0.3.0", kind=f"{self.vendor}/{CLAIM_CLASS}", devices=devices)
        return Spec(cdi_version=minimum_version(spec), kind=spec.kind, devices=spec.devices)

    def write(self, uid: str, edits: Mapping[str, ContainerEdits]) -> None:
        try:
            write_spec(self.cdi_root, self.file_name(uid), self.spec(uid, edits))
        except OSError as exc:
            raise CdiSpecError(explain_os_error(exc, self.path(uid), "writing the CDI spec", CDI_ROOT_HINT)) from exc

    def problem(self, uid: str, edits: Mapping[str, ContainerEdits]) -> str | None:
        """None when the file holds exactly what `write` would write now."""
        return spec_file_problem(self.path(uid), self.spec(uid, edits))

    def remove(self, uid: str) -> bool:
        if not os.path.lexists(self.path(uid)):
            return False
        try:
            return remove_spec(self.cdi_root, self.file_name(uid))
        except OSError as exc:
            raise CdiSpecError(explain_os_error(exc, self.path(uid), "removing the CDI spec", CDI_ROOT_HINT)) from exc

    def uids_on_disk(self) -> set[str]:
        if not self.cdi_root.is_dir():
            return set()
        found = set()
        for path in self.cdi_root.iterdir():
            uid = self._claim_uid(path.name)
            if uid is not None and path.is_file():
                found.add(uid)
        return found

    def sweep_temp_files(self) -> list[Path]:
        return sweep_temp_files(self.cdi_root, self._is_our_temp_file)

    def _is_our_temp_file(self, name: str) -> bool:
        match = self._temp_re.fullmatch(name)
        return match is not None and self._claim_uid(match["target"]) is not None


def device_env_key(device_name: str) -> str:
    """`DRA_DEVICE_<NAME>`, as the GPU driver names its per-device variables."""
    return "DRA_DEVICE_" + re.sub(r"[^A-Za-z0-9]", "_", device_name).upper()


def join_edits(parts: Sequence[ContainerEdits]) -> ContainerEdits:
    out = ContainerEdits()
    for part in parts:
        out = out.append(part)
    return out
