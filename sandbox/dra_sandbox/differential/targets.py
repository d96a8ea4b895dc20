"""The two sides the corpus is sent to: the sandbox (its API server and scheduler stand-in, in this process) and
upstream (etcd, kube-apiserver, kube-controller-manager and kube-scheduler of one release, `dra_sandbox.upstream`).

Both are driven by the same harness through the product's own client (`KubeRest`); a target only knows how to start,
how to let its scheduler run over what the harness created, and what a node without a kubelet needs there.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Protocol

from dra_driver.k8s.client import ApiError, JsonObject, KubeRest
from dra_sandbox.apiserver import ApiServer
from dra_sandbox.polling import wait_for
from dra_sandbox.rest import merge_patch
from dra_sandbox.scheduler import SandboxScheduler
from dra_sandbox.upstream.build import (
    DEFAULT_MINOR,
    ReleaseBinaries,
    etcd_component,
    find_release,
    kubernetes_component,
)
from dra_sandbox.upstream.controlplane import FEATURE_GATES, ControlPlane, ControlPlaneConfig

SANDBOX_VERSION: Final = "1.37.2"  # the upstream pin (build.py RELEASES), so both report one version
SETTLE_TIMEOUT_S: Final = 120.0
LEASE_NAMESPACE: Final = "kube-node-lease"
LEASE_RENEW_S: Final = 5.0
UPSTREAM_COMPONENTS: Final = (kubernetes_component, etcd_component)  # no node: no containerd needed

PodKey = tuple[str, str]  # namespace, name


class Target(Protocol):
    name: str
    rest: KubeRest
    # How long the harness waits for a pending pod's FailedScheduling Event once the pod is settled: the sandbox
    # records it in the same pass, kube-scheduler's broadcaster some time later.
    event_wait_s: float

    def namespace_ready(self, namespace: str) -> None: ...

    def nodes_created(self, names: Sequence[str]) -> None: ...

    def nodes_deleted(self, names: Sequence[str]) -> None: ...

    def schedule(self, pods: Sequence[PodKey]) -> None: ...

    def close(self) -> None: ...


def _settled(pod: JsonObject | None) -> bool:
    if pod is None:
        return True  # refused at create: nothing to schedule
    if (pod.get("spec") or {}).get("nodeName"):
        return True
    return any(c.get("type") == "PodScheduled" and c.get("status") == "False"
               for c in (pod.get("status") or {}).get("conditions") or [])


class SandboxTarget:
    """The sandbox API server and scheduler stand-in; the scheduler's passes are made on request, not by a thread,
    so a batch is scheduled exactly once, in creation order."""

    name = "sandbox"
    event_wait_s = 0.0

    def __init__(self, kube_version: str = SANDBOX_VERSION) -> None:
        # The gates the upstream control plane runs with (controlplane.FEATURE_GATES), so that fields behind them
        # (list attributes, compatibility groups) are compared as served on both sides.
        gates = FEATURE_GATES.get(".".join(kube_version.split(".")[:2]), {})
        self.server = ApiServer(kube_version=kube_version, feature_gates=gates).start()
        self.rest = self.server.rest(timeout=60.0)
        self.scheduler = SandboxScheduler(self.rest, kubernetes_minor=int(kube_version.split(".")[1]),
                                          feature_gates=gates)

    def namespace_ready(self, namespace: str) -> None:
        return None

    def nodes_created(self, names: Sequence[str]) -> None:
        return None

    def nodes_deleted(self, names: Sequence[str]) -> None:
        return None

    def schedule(self, pods: Sequence[PodKey]) -> None:
        self.scheduler.reconcile()

    def close(self) -> None:
        self.rest.close()
        self.server.stop()


class UpstreamTarget:
    """Upstream's control plane. Nodes have no kubelet, so this target keeps their Leases renewed (the node
    lifecycle controller would otherwise mark them unreachable after its grace period and taint them)."""

    name = "upstream"
    event_wait_s = 30.0

    def __init__(self, work_dir: Path, binaries: ReleaseBinaries, say: Callable[[str], None] = lambda _: None) -> None:
        self.plane = ControlPlane(ControlPlaneConfig(work_dir, binaries))
        self.plane.start(say)
        self.rest = self.plane.admin()
        self._nodes: set[str] = set()
        self._guard = threading.Lock()
        self._stop = threading.Event()
        self._renewer = threading.Thread(target=self._renew, name="differential-node-leases", daemon=True)
        self._renewer.start()

    def namespace_ready(self, namespace: str) -> None:
        # The ServiceAccount admission plugin refuses pods until kube-controller-manager made `default`.
        wait_for(lambda: self.rest.get(f"/api/v1/namespaces/{namespace}/serviceaccounts/default"), 60.0,
                 f"the ServiceAccount {namespace}/default")

    def _lease(self, node: str) -> JsonObject:
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": node, "namespace": LEASE_NAMESPACE},
                "spec": {"holderIdentity": node, "leaseDurationSeconds": 40, "renewTime": now}}

    def nodes_created(self, names: Sequence[str]) -> None:
        for node in names:
            self.rest.request("POST", f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases",
                              body=self._lease(node))
        with self._guard:
            self._nodes.update(names)

    def nodes_deleted(self, names: Sequence[str]) -> None:
        with self._guard:
            self._nodes.difference_update(names)
        for node in names:
            with contextlib.suppress(ApiError):
                self.rest.request("DELETE", f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases/{node}")

    def _renew(self) -> None:
        while not self._stop.wait(LEASE_RENEW_S):
            with self._guard:
                nodes = sorted(self._nodes)
            for node in nodes:
                with contextlib.suppress(ApiError):
                    merge_patch(self.rest, f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases/{node}",
                                {"spec": {"renewTime": self._lease(node)["spec"]["renewTime"]}})

    def _snapshot(self, pods: Sequence[PodKey]) -> list[Any]:
        out = []
        for namespace, name in pods:
            pod = self.rest.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
            if not _settled(pod):
                return []
            out.append(None if pod is None else ((pod.get("spec") or {}).get("nodeName"), [
                c.get("message") for c in (pod.get("status") or {}).get("conditions") or []
                if c.get("type") == "PodScheduled"]))
        return out

    def schedule(self, pods: Sequence[PodKey]) -> None:
        """Until every pod is bound or Unschedulable, and two looks a second apart agree (a pod tried before the
        scheduler's informers saw its claim is tried again when they do)."""
        previous: list[list[Any]] = [[]]

        def stable() -> bool:
            now = self._snapshot(pods)
            same = bool(now) and now == previous[0]
            previous[0] = now
            return same or (not pods)

        wait_for(stable, SETTLE_TIMEOUT_S, "kube-scheduler to bind or give up on every pod", interval=1.0)

    def close(self) -> None:
        self._stop.set()
        self._renewer.join(timeout=10)
        self.plane.stop()


def upstream_binaries(minor: str = DEFAULT_MINOR) -> ReleaseBinaries | None:
    """The cached binaries of the release (nothing is built here), or None."""
    return find_release(minor, components=UPSTREAM_COMPONENTS)


def delete_all(rest: KubeRest, paths: Iterable[str], query: dict[str, str | int | bool] | None = None) -> None:
    for path in paths:
        with contextlib.suppress(ApiError):
            rest.request("DELETE", path, query=query)
