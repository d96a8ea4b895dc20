"""`dra-sandbox up --kubernetes upstream`: upstream's control plane with what the chart installs, as one context
manager (docs/upstream.md). Nodes join it through `plane` (its address, CA and admin client) and
`install.plugin_kubeconfig`.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from dra_sandbox.upstream.build import build_release
from dra_sandbox.upstream.controlplane import ControlPlane, ControlPlaneConfig
from dra_sandbox.upstream.install import Installed, install_chart
from dra_sandbox.upstream.pki import KEY_MODE


class UpstreamCluster:
    """Builds (or finds) the release's binaries, starts the control plane in `<work_dir>/controlplane`, installs the
    chart, and writes the admin kubeconfig to `<work_dir>/kubeconfig` (where `up` writes it for the sandbox)."""

    def __init__(self, work_dir: Path, minor: str, say: Callable[[str], None] = print,
                 chart_sets: Sequence[str] = ()) -> None:
        self.work_dir = work_dir
        self.minor = minor
        self.say = say
        self.chart_sets = tuple(chart_sets)
        self.plane: ControlPlane | None = None
        self.installed: Installed | None = None
        self.timings: dict[str, float] = {}
        self.cdi_root: Path | None = None  # no fake node writes CDI specs here (the real node's containerd reads them)

    @property
    def kubeconfig(self) -> Path:
        return self.work_dir / "kubeconfig"

    def child_pids(self) -> dict[str, int]:
        return self.plane.child_pids() if self.plane is not None else {}

    def __enter__(self) -> UpstreamCluster:
        started = time.monotonic()
        binaries = build_release(self.minor, self.say)
        self.timings["binaries"] = time.monotonic() - started
        self.plane = ControlPlane(ControlPlaneConfig(self.work_dir / "controlplane", binaries))
        try:
            self.plane.start(self.say)
            self.timings["control plane"] = time.monotonic() - started
            self.installed = install_chart(self.plane, self.chart_sets)
            self.timings["chart"] = time.monotonic() - started
            shutil.copyfile(self.plane.admin_kubeconfig, self.kubeconfig)
            self.kubeconfig.chmod(KEY_MODE)
        except BaseException:
            self.plane.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self.plane is not None:
            self.plane.stop()
        self.kubeconfig.unlink(missing_ok=True)
