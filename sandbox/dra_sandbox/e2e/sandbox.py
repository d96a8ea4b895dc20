"""The e2e backend for the in-process sandbox cluster, and the sandbox the scenarios are written for.

`e2e_cluster_config` is the one definition of that sandbox (used by `dra-sandbox e2e` and `dra-sandbox demo`):
three nodes with fake GPUs (`E2E_NODES`), each labelled with its scenario alias, and the DeviceClasses the Helm chart
installs (from `dra_sandbox.deviceclasses`, the shared source of truth).
"""

from __future__ import annotations

import json
from collections.abc import Collection
from pathlib import Path
from typing import Any

from dra_driver import defaults
from dra_driver.inventory.passthrough import PASSTHROUGH_LABEL
from dra_driver.k8s.client import ApiError
from dra_sandbox.cluster import ClusterConfig, NodeSpec, SandboxCluster
from dra_sandbox.deviceclasses import device_classes
from dra_sandbox.e2e.backend import BackendError, ContainerView, FakeNvmlNodes, condition_message
from dra_sandbox.e2e.scenario import NODE_LABEL, VGPU_MDEV, JsonObject, ObjectRef
from dra_sandbox.kubelet import CONTAINERS_ANNOTATION

DRIVER_NAME = defaults.DRIVER_NAME
E2E_KUBE_VERSION = "1.36.0"
# alias -> (node name, fake NVML preset). dgx-h100: MIG off, so whole GPUs, every dynamic MIG placement and
# (sharing mode shares) every GPU as shares are offered; dgx-a100: MIG already on, so only MIG partitions are;
# a100-whole: the same DGX A100 with MIG off (Ampere never toggles it), so whole A100 GPUs, for specs that
# select A100s by productName (NVIDIA's quickstart gpu-test6).
E2E_NODES: dict[str, tuple[str, str]] = {
    "h100": ("node-h100", "fake:dgx-h100"),
    "a100": ("node-a100", "fake:dgx-a100"),
    "a100-whole": ("node-a100-whole", "fake:dgx-a100,mig=off"),
}

# Shares need nothing from a node that does not publish them; on the H100 node they sit beside the exclusive GPU.
E2E_PLUGIN_ENV: dict[str, dict[str, str]] = {"h100": {"DRA_DRIVER_SHARING_MODE": "shares"}}
VGPU_PLUGIN_ENV = {"DRA_DRIVER_VGPU": "all"}  # the vGPU sandbox (scenarios with `vgpu: true`)
# The Fabric Manager sandbox (scenarios with `fabricPartitions: true`).
FM_PLUGIN_ENV = {"DRA_DRIVER_FABRIC_PARTITIONS": "on"}


def e2e_plugin_env(alias: str, consumable_shares: str | None = None) -> dict[str, str]:
    """A node's plugin settings: the default sandbox, or (for scenarios that need NVIDIA's consumable-shares modes)
    every node with `--consumable-shares <mode>`, which excludes `--sharing-mode shares`."""
    if consumable_shares is None:
        return dict(E2E_PLUGIN_ENV.get(alias, {}))
    return {"DRA_DRIVER_CONSUMABLE_SHARES": consumable_shares}


def e2e_cluster_config(
    work_dir: Path,
    runtime: str = "auto",
    *,
    webhook: bool = True,
    consumable_shares: str | None = None,
    aliases: Collection[str] | None = None,
    passthrough: bool = False,
    driver_absent: bool = False,
    vgpu: str | None = None,
    device_plugin: bool = False,
    fabric_partitions: bool = False,
) -> ClusterConfig:
    """The e2e sandbox: every E2E_NODES node, or only those of `aliases` (a sandbox started for a few scenarios
    that name the nodes they need starts no plugin nobody uses). `passthrough`: every node's GPUs are also offered
    for passthrough, through the node label the chart documents (docs/passthrough.md). `driver_absent`: every node
    starts without its NVIDIA driver (scenarios with `driver: absent-at-start`). `vgpu`: every node is a vGPU host
    (the fake's `vgpu=true`; `mdev`: with mediated devices, `vgpu_mdev=true`) whose plugin offers its GPUs as vGPUs
    (`--vgpu all`, docs/vgpu.md). `fabric_partitions`: every node's Fabric Manager offers GPU partitions (the fake's
    `fabric_partitions=true`) and its plugin offers them (`--fabric-partitions on`, docs/passthrough.md)."""
    host = "" if vgpu is None else ",vgpu=true" + (",vgpu_mdev=true" if vgpu == VGPU_MDEV else "")
    host += ",fabric_partitions=true" if fabric_partitions else ""
    env = {**(VGPU_PLUGIN_ENV if vgpu else {}), **(FM_PLUGIN_ENV if fabric_partitions else {})}
    more = passthrough_labels(DRIVER_NAME) if passthrough else {}
    nodes = [
        NodeSpec(name, nvml + host, mig_mode="dynamic", labels={NODE_LABEL: alias, **more},
                 plugin_env={**e2e_plugin_env(alias, consumable_shares), **env}, driver_absent=driver_absent)
        for alias, (name, nvml) in E2E_NODES.items()
        if aliases is None or alias in aliases
    ]  # fmt: skip
    return ClusterConfig(
        work_dir=work_dir,
        nodes=nodes,
        driver_name=DRIVER_NAME,
        runtime=runtime,
        device_classes=device_classes(DRIVER_NAME),
        controller=True,  # scenarios may apply GpuSharingPolicies
        webhook=webhook,  # and expect a bad claim to be refused at apply (`applyFails`)
        # The kind recipe's default release (e2e/kind): DeviceTaintRules in v1beta2, as the example driver's taint
        # specs use them.
        kube_version=E2E_KUBE_VERSION,
        device_plugin=device_plugin,  # the kubelets' device manager and --device-plugin on (docs/device-plugin.md)
    )


# The compute-domain sandbox (scenarios with `cluster: compute-domains`, issue 24): four GB200 NVL72 trays of one
# NVLink clique (the fake preset gb200-nvl72 gives every node the same cluster UUID and clique), labelled
# gb200-a..gb200-d, each with the GPU plugin and the compute-domain kubelet plugin; the controller reconciles
# ComputeDomains; the IMEX daemon pods run as host processes with the stand-in nvidia-imex.
COMPUTE_DOMAIN_PRESET = "gb200-nvl72"
COMPUTE_DOMAIN_NODES: dict[str, str] = {f"gb200-{x}": f"node-gb200-{x}" for x in "abcd"}


def compute_domain_support() -> str:
    """Why the compute-domain sandbox cannot start here ("" when it can)."""
    from dra_driver.nvml.fake.nodefile import preset_names

    if COMPUTE_DOMAIN_PRESET not in preset_names():
        return f"the fake NVML has no {COMPUTE_DOMAIN_PRESET} preset yet (issue 24, fabric discovery)"
    return ""


def compute_domain_cluster_config(work_dir: Path, runtime: str = "auto",
                                  aliases: Collection[str] | None = None) -> ClusterConfig:
    """The compute-domain sandbox: every COMPUTE_DOMAIN_NODES node, or those of `aliases`."""
    nodes = [NodeSpec(name, f"fake:{COMPUTE_DOMAIN_PRESET}", mig_mode="none", labels={NODE_LABEL: alias})
             for alias, name in COMPUTE_DOMAIN_NODES.items() if aliases is None or alias in aliases]
    return ClusterConfig(
        work_dir=work_dir, nodes=nodes, driver_name=DRIVER_NAME, runtime=runtime,
        device_classes=device_classes(DRIVER_NAME), controller=True, webhook=False, kube_version=E2E_KUBE_VERSION,
        serve_timeout_s=120.0)
def passthrough_labels(driver_name: str) -> dict[str, str]:
    """The node label `dra-sandbox up --passthrough` stands for: `<driver>/passthrough=true` (plugin/app.py)."""
    return {f"{driver_name}/{PASSTHROUGH_LABEL}": "true"}


def container_view(pod: JsonObject, container: str) -> ContainerView | None:
    """What the sandbox kubelet recorded for the container in the pod's annotation (None: not started yet)."""
    raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(CONTAINERS_ANNOTATION)
    if not raw:
        return None
    try:
        record: Any = json.loads(raw)
    except json.JSONDecodeError:
        return None
    entry = record.get(container) if isinstance(record, dict) else None
    if not isinstance(entry, dict):
        return None
    env = entry.get("env") or {}
    return ContainerView(
        env={str(k): str(v) for k, v in env.items()} if isinstance(env, dict) else {},
        runtime=str(entry.get("runtime") or "sandbox"),
        executed=bool(entry.get("executed")),
        cdi_devices=tuple(str(d) for d in entry.get("cdiDevices") or ()),
        note=str(entry.get("note") or entry.get("error") or ""),
        device_nodes=tuple(str(d.get("path")) for d in entry.get("deviceNodes") or () if isinstance(d, dict)),
        mounts=tuple(str(m.get("target")) for m in entry.get("mounts") or () if isinstance(m, dict)),
    )


class SandboxBackend(FakeNvmlNodes):
    """Drives a started SandboxCluster through its API server."""

    name = "sandbox"
    poll_interval = 0.1

    def __init__(self, cluster: SandboxCluster) -> None:
        self.cluster = cluster

    def apply(self, obj: JsonObject) -> None:
        try:
            self.cluster.apply(obj)
        except ApiError as exc:
            raise BackendError(f"applying {obj['kind']}/{obj['metadata']['name']}: {exc}") from exc

    def delete(self, ref: ObjectRef) -> None:
        self.cluster.delete(ref.manifest_stub())  # a missing object is fine (the helper ignores API errors)

    def get(self, ref: ObjectRef) -> JsonObject | None:
        try:
            return self.cluster.get(ref.manifest_stub())
        except ApiError as exc:
            raise BackendError(f"reading {ref}: {exc}") from exc

    def nodes(self) -> list[JsonObject]:
        try:
            return self.cluster.items("/api/v1/nodes")
        except ApiError as exc:
            raise BackendError(f"listing nodes: {exc}") from exc

    def resource_slices(self) -> list[JsonObject]:
        try:
            return self.cluster.items("/apis/resource.k8s.io/v1/resourceslices")
        except ApiError as exc:
            raise BackendError(f"listing ResourceSlices: {exc}") from exc

    def container(self, pod: JsonObject, container: str) -> ContainerView | None:
        return container_view(pod, container)

    def scheduling_message(self, pod: JsonObject) -> str:
        return condition_message(pod)

    def events(self, about: ObjectRef) -> list[JsonObject]:
        namespace = about.namespace or "default"
        try:
            items = self.cluster.items(f"/api/v1/namespaces/{namespace}/events")
        except ApiError as exc:
            raise BackendError(f"listing the Events of {about}: {exc}") from exc
        return [e for e in items if (e.get("involvedObject") or {}).get("kind") == about.kind
                and (e.get("involvedObject") or {}).get("name") == about.name]

    def healthz(self, node: str) -> tuple[int, str] | None:
        plugin = self.cluster.plugins.get(node)
        return plugin.healthz() if plugin is not None else None

    def nvml_spec(self, node: str) -> str:
        plugin = self.cluster.plugins.get(node)
        if plugin is None:
            raise BackendError(f"node {node} runs no kubelet plugin in this sandbox")
        return plugin.nvml_spec
