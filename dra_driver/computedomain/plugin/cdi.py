"""The compute-domain plugin's per-claim CDI specs: `<cdi-root>/k8s.compute-domain.gpu.dra.dev-claim_<node>_<uid>.json`,
kind `k8s.compute-domain.gpu.dra.dev/claim`, one CDI device `<claimUID>-<device>` per prepared device, written
atomically (0644) with the lowest cdiVersion that covers it. The edits of each device are its effect's
(effects/imex_channel.py, effects/daemon_dir.py); the files are `cdi.claimspecs.ClaimSpecFiles`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from dra_driver.cdi.claimspecs import ClaimSpecFiles, cdi_device_name
from dra_driver.cdi.model import ContainerEdits, Device, Spec
from dra_driver.cdi.version import minimum_version
from dra_driver.kubeletplugin.names import is_uid


class SpecFiles(ClaimSpecFiles):
    def __init__(self, cdi_root: Path, driver_name: str, node_name: str) -> None:
        super().__init__(cdi_root, driver_name, node_name, is_uid)

    def spec(self, uid: str, edits: Mapping[str, ContainerEdits]) -> Spec:
        """`edits`: device name -> its edits, in the claim's device order."""
        devices = tuple(Device(name=cdi_device_name(uid, name), container_edits=e) for name, e in edits.items())
        spec = Spec(cdi_version="0.3.0", kind=self.kind, devices=devices)
        return Spec(cdi_version=minimum_version(spec), kind=spec.kind, devices=spec.devices)

    def write(self, uid: str, edits: Mapping[str, ContainerEdits]) -> None:
        self.write_spec(uid, self.spec(uid, edits))

    def problem(self, uid: str, edits: Mapping[str, ContainerEdits]) -> str | None:
        """None when the file holds exactly what `write` would write now."""
        return self.spec_problem(uid, self.spec(uid, edits))


def device_env_key(device_name: str) -> str:
    """`DRA_DEVICE_<NAME>`, as the GPU driver names its per-device variables."""
    return "DRA_DEVICE_" + re.sub(r"[^A-Za-z0-9]", "_", device_name).upper()


def join_edits(parts: Sequence[ContainerEdits]) -> ContainerEdits:
    out = ContainerEdits()
    for part in parts:
        out = out.append(part)
    return out
