"""Fallback runtime: "CDI checked, not executed".

Where no container can run, this resolves the CDI ids with the same rules (dra_driver.cdi) and
reports the env, mounts and device nodes a container WOULD get. Results say `executed: False` and
carry a note, so nobody mistakes them for what a real container saw.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

from dra_driver.cdi import CdiError
from dra_driver.cdi.model import DeviceNode
from dra_sandbox.runtime.cdi import ContainerConfig, apply_edits, load_registry
from dra_sandbox.runtime.cdi.registry import DEFAULT_SPEC_DIRS
from dra_sandbox.runtime.types import ContainerRequest, ContainerResult, ObservedDevice, ObservedMount

NOT_EXECUTED_NOTE = "CDI checked, not executed: specs resolved with dra_driver.cdi; no container was started"
BASE_ENV: tuple[str, ...] = ("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",)


def _observed_device(node: DeviceNode) -> ObservedDevice:
    """Fill type/major/minor from the host node when the spec leaves them out (as runtimes do)."""
    kind, major, minor = node.type, node.major, node.minor
    if kind is None or major is None or minor is None:
        try:
            st = os.stat(node.host_path or node.path)
        except OSError:
            st = None
        if st is not None and (stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)):
            kind = kind or ("c" if stat.S_ISCHR(st.st_mode) else "b")
            major = os.major(st.st_rdev) if major is None else major
            minor = os.minor(st.st_rdev) if minor is None else minor
    return ObservedDevice(node.path, kind or "?", major, minor)


class CdiCheckedRuntime:
    def __init__(self, cdi_dirs: Sequence[str | Path] = DEFAULT_SPEC_DIRS, reason: str = "") -> None:
        self._cdi_dirs = tuple(cdi_dirs)
        self.reason = reason

    @property
    def name(self) -> str:
        return "cdi-check"

    def run(self, request: ContainerRequest) -> ContainerResult:
        note = NOT_EXECUTED_NOTE + (f" ({self.reason})" if self.reason else "")
        registry = load_registry(self._cdi_dirs)
        try:
            edits = registry.resolve(request.cdi_devices)
        except CdiError as exc:
            return ContainerResult(
                runtime=self.name,
                executed=False,
                exit_code=128,
                cdi_devices=request.cdi_devices,
                error=f"{exc.message} (searched {', '.join(map(str, self._cdi_dirs))})",
                note=note,
            )
        base = ContainerConfig(env=BASE_ENV + tuple(f"{k}={v}" for k, v in request.env))
        config = apply_edits(base, edits)
        mounts = tuple(
            ObservedMount(m.container_path, m.host_path, m.type or "bind", m.options) for m in config.mounts
        )
        return ContainerResult(
            runtime=self.name,
            executed=False,
            exit_code=0,
            cdi_devices=request.cdi_devices,
            env=config.env_map(),
            mounts=mounts,
            device_nodes=tuple(_observed_device(n) for n in config.device_nodes),
            additional_gids=config.additional_gids,
            files={path: read_through_mounts(path, mounts) for path in request.inspect_paths},
            note=note,
        )


INSPECT_LIMIT = 8192  # what the probe of a real container reads of a file (runtime/probe.py)


def read_through_mounts(path: str, mounts: Sequence[ObservedMount]) -> str | None:
    """What a container would read at `path` when only the CDI mounts give it files: the host file behind the last
    bind mount that covers the path (later mounts shadow earlier ones), as the probe reads it (8 KiB, one trailing
    newline dropped). None when no mount covers it or the host file cannot be read."""
    target = PurePosixPath(path)
    for mount in reversed(mounts):
        if mount.fstype != "bind" and not {"bind", "rbind"} & set(mount.options):
            continue  # a tmpfs or the like: nothing of the host behind it
        where = PurePosixPath(mount.target)
        if target != where and where not in target.parents:
            continue
        host = Path(mount.source) / target.relative_to(where) if target != where else Path(mount.source)
        try:
            with host.open("rb") as f:
                data = f.read(INSPECT_LIMIT - 1)
        except OSError:
            return None
        text = data.decode(errors="replace")
        return text[:-1] if text.endswith("\n") else text
    return None
