"""`dra-sandbox up --kubernetes upstream`: upstream's control plane with what the chart installs, as one context
manager (docs/upstream.md). Nodes join it through `plane` (its address, CA and admin client) and
`install.plugin_kubeconfig`.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from dra_sandbox.cluster import NodeSpec
from dra_sandbox.paths import Below
from dra_sandbox.upstream.build import ReleaseBinaries, build_release
from dra_sandbox.upstream.controlplane import ControlPlane, ControlPlaneConfig
from dra_sandbox.upstream.install import Installed, install_chart
from dra_sandbox.upstream.node import RealNode, RealNodeSpec, unavailable_reason
from dra_sandbox.upstream.pki import KEY_MODE
from dra_sandbox.upstream.simnodes import SimulatedNodes


class UpstreamCluster:
    """Builds (or finds) the release's binaries, starts the control plane in `<work_dir>/controlplane`, installs the
    chart, starts the real node `real_node` (docs/upstream.md "Real node"; where this machine cannot run one, it
    says why and simulates that node too), then the kubelet simulator's nodes `simulated` (docs/upstream.md
    "Simulated nodes"), and writes the admin kubeconfig to `<work_dir>/kubeconfig` (where `up` writes it
    for the sandbox)."""

    def __init__(self, work_dir: Path, minor: str, say: Callable[[str], None] = print,
                 chart_sets: Sequence[str] = (), real_node: RealNodeSpec | None = None,
                 simulated: Sequence[NodeSpec] = (), runtime_config: Sequence[str] = ()) -> None:
        self.work_dir = work_dir
        self.minor = minor
        self.say = say
        self.chart_sets = tuple(chart_sets)
        self.plane: ControlPlane | None = None
        self.installed: Installed | None = None
        self.timings: dict[str, float] = {}
        self.real_node = real_node
        self.node: RealNode | None = None
        self.cdi_root: Path | None = None  # where the real node's plugin writes CDI specs (its containerd reads them)
        self.simulated_specs = tuple(simulated)
        self.runtime_config = tuple(runtime_config)  # more API versions (`group/version=true`) than the release's
        self.simulated: SimulatedNodes | None = None

    kubeconfig = Below("kubeconfig", base="work_dir")

    def child_pids(self) -> dict[str, int]:
        pids = self.plane.child_pids() if self.plane is not None else {}
        pids = {**pids, **(self.node.child_pids() if self.node is not None else {})}
        return {**pids, **(self.simulated.child_pids() if self.simulated is not None else {})}

    def __enter__(self) -> UpstreamCluster:
        started = time.monotonic()
        binaries = build_release(self.minor, self.say)
        self.timings["binaries"] = time.monotonic() - started
        self.plane = ControlPlane(ControlPlaneConfig(self.work_dir / "controlplane", binaries,
                                                     extra_runtime_config=self.runtime_config))
        try:
            self.plane.start(self.say)
            self.timings["control plane"] = time.monotonic() - started
            self.installed = install_chart(self.plane, self.chart_sets)
            self.timings["chart"] = time.monotonic() - started
            self._start_node(binaries, started)
            self._start_simulated(binaries, started)
            shutil.copyfile(self.plane.admin_kubeconfig, self.kubeconfig)
            self.kubeconfig.chmod(KEY_MODE)
        except BaseException:
            self._stop_simulated()
            self._stop_node()
            self.plane.stop()
            raise
        return self

    def _start_node(self, binaries: ReleaseBinaries, started: float) -> None:
        if self.real_node is None or self.plane is None:
            return
        reason = unavailable_reason()
        if reason is not None:
            spec = self.real_node
            self.say(f"upstream: NO REAL NODE on this machine ({reason}); {spec.name} is a simulated node")
            self.simulated_specs = (NodeSpec(spec.name, spec.nvml, spec.mig_mode, dict(spec.labels),
                                             dict(spec.plugin_env)), *self.simulated_specs)
            return
        self.node = RealNode(self.plane, binaries, self.real_node, self.work_dir)
        self.node.start(self.say)
        self.cdi_root = self.node.cdi_dir
        self.timings["real node"] = time.monotonic() - started

    def _start_simulated(self, binaries: ReleaseBinaries, started: float) -> None:
        if not self.simulated_specs or self.plane is None:
            return
        minor = int(binaries.release.minor.split(".")[1])
        self.simulated = SimulatedNodes(self.plane, self.simulated_specs, self.work_dir, minor)
        self.simulated.start(self.say)
        self.timings["simulated nodes"] = time.monotonic() - started

    def _stop_simulated(self) -> None:
        if self.simulated is not None:
            self.simulated.stop()
            self.simulated = None

    def _stop_node(self) -> None:
        if self.node is not None:
            self.node.stop()
            self.node = None

    def __exit__(self, *exc: object) -> None:
        self._stop_simulated()
        self._stop_node()
        if self.plane is not None:
            self.plane.stop()
        self.kubeconfig.unlink(missing_ok=True)
