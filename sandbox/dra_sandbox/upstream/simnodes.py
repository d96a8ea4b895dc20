"""The kubelet simulator's fake-GPU nodes joined to an upstream control plane (docs/upstream.md "Simulated nodes").

Each node is what `dra-sandbox up --nodes` runs on the sandbox's own API server: a `KubeletSimulator` (Node and
Lease, pod sync, the plugin watcher and registration, pod IPs from the node's loopback range) and the real
`dra-driver kubelet-plugin` process on fake NVML. Here the simulator logs in as that node's kubelet: a client
certificate `system:node:<name>` in group `system:nodes` signed by the control plane's client CA, so kube-apiserver's
Node authorizer and NodeRestriction judge every call it makes as they judge a kubelet's. The plugin logs in as the
chart's plugin ServiceAccount with a token bound to the Node (`install.plugin_kubeconfig`), as on the real node.
kube-scheduler schedules onto these nodes and kube-controller-manager runs their lifecycle; the simulator runs the
pods as it does in the sandbox (CDI-checked containers: `sandbox.dra.dev/containers`, written through pods/status).

Files: `<work dir>/<node>/` (kubelet.kubeconfig, plugin.kubeconfig, plugin.log, nvml/, the plugin sockets) and
`<work dir>/sim-cdi/` (the CDI specs of every simulated node's plugin).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

from kubernetes import client as k8s
from kubernetes import config as k8s_config

from dra_driver import defaults
from dra_driver.computedomain.names import DRIVER_NAME as CD_DRIVER_NAME
from dra_driver.k8s.client import JsonObject
from dra_sandbox.cluster import (
    GPU_NODE_LABELS,
    ClusterConfig,
    NodeSpec,
    PluginProcess,
    pod_network_octet,
    remove_node_specs,
)
from dra_sandbox.computedomainplugin import CdPluginProcess, wants_compute_domains
from dra_sandbox.imex import install_standins
from dra_sandbox.kubelet.nodestatus import NodeFacts, NodeStatusConfig
from dra_sandbox.kubelet.podips import node_ip, node_pod_cidr
from dra_sandbox.kubelet.processpods import ProcessPodSettings
from dra_sandbox.kubelet.registration import RegistrationConfig
from dra_sandbox.kubelet.simulator import KubeletConfig, KubeletSimulator
from dra_sandbox.kubelet.versions import KubeletGates
from dra_sandbox.polling import wait_for
from dra_sandbox.runtime import CdiCheckedRuntime
from dra_sandbox.upstream.controlplane import ControlPlane
from dra_sandbox.upstream.install import NAMESPACE, RELEASE, plugin_kubeconfig, service_account_token
from dra_sandbox.upstream.pki import kubeconfig, token_kubeconfig, write_private

SERVE_TIMEOUT_S = 60.0
# The chart's ServiceAccount of the IMEX daemon pods (templates/computedomains.yaml), which the controller's
# DaemonSets run as; the simulator runs those pods as host processes and hands them its token.
DAEMON_SERVICE_ACCOUNT = f"{RELEASE}-compute-domain-daemon"
PUBLISH_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class _Host:
    """What PluginProcess reads from its cluster (cluster.PluginHost)."""

    config: ClusterConfig
    kubeconfig: Path
    cdi_root: Path


class SimulatedNodes:
    """Start with start(), stop with stop(); `kubelets` and `plugins` by node name while running."""

    def __init__(self, plane: ControlPlane, nodes: Sequence[NodeSpec], work_dir: Path, kubernetes_minor: int,
                 driver_name: str = defaults.DRIVER_NAME) -> None:
        self.plane = plane
        self.nodes = list(nodes)
        self.work_dir = work_dir
        self.minor = kubernetes_minor
        self.driver_name = driver_name
        self.cdi_root = work_dir / "sim-cdi"
        self.kubelets: dict[str, KubeletSimulator] = {}
        self.plugins: dict[str, PluginProcess] = {}
        self.cd_plugins: dict[str, CdPluginProcess] = {}  # node -> its compute-domain kubelet plugin
        self.timings: dict[str, float] = {}
        self._clients: list[k8s.ApiClient] = []
        config = ClusterConfig(work_dir=work_dir, nodes=self.nodes, driver_name=driver_name, runtime="cdi-check")
        self._host = _Host(config, plane.admin_kubeconfig, self.cdi_root)

    def child_pids(self) -> dict[str, int]:
        """node -> pid of its running kubelet-plugin process (children.json names, as `up`'s sandbox nodes)."""
        return {name: p.process.pid for name, p in self.plugins.items()
                if p.process is not None and p.process.poll() is None}

    def nvml_spec(self, node: str) -> str | None:
        plugin = self.plugins.get(node)
        return plugin.nvml_spec if plugin is not None else None

    def start(self, say: Callable[[str], None] = lambda _: None) -> None:
        if not self.nodes:
            return
        started = time.monotonic()
        self.cdi_root.mkdir(parents=True, exist_ok=True)
        remove_node_specs(self.cdi_root, self.driver_name, [n.name for n in self.nodes])  # a killed run's
        # Only the CDI check: these GPUs are fake and their specs live in a dir of ours (docs/sandbox.md "Runtimes").
        runtime = CdiCheckedRuntime([self.cdi_root], reason="simulated node of an upstream cluster")
        octet = pod_network_octet(self.work_dir)
        processes = self._process_pod_settings()
        say(f"upstream: simulated node(s) {', '.join(n.name for n in self.nodes)} (kubelet simulator, GPU kubelet "
            "plugin), logged in as system:node:<name>")
        try:
            for index, node in enumerate(self.nodes):
                self._start_node(node, index, octet, runtime, processes)
            for plugin in self.plugins.values():
                if not plugin.node.driver_absent:
                    plugin.wait_serving(SERVE_TIMEOUT_S)
                else:
                    plugin.wait_probed(SERVE_TIMEOUT_S)
            for cd_plugin in self.cd_plugins.values():
                cd_plugin.wait_serving(SERVE_TIMEOUT_S)
            for node in self.nodes:
                if not node.driver_absent:
                    wait_for(partial(self._published, node.name), PUBLISH_TIMEOUT_S,
                             f"the ResourceSlices of simulated node {node.name}", interval=0.3)
        except BaseException:
            self.stop()
            raise
        self.timings["simulated nodes"] = time.monotonic() - started

    def _process_pod_settings(self) -> ProcessPodSettings | None:
        """How the simulator runs the IMEX daemon pods (host processes, as in the sandbox: docs/sandbox.md), logged
        in with a token of the chart's daemon ServiceAccount, as a projected token of their pod would; None when the
        chart installs no ComputeDomain parts."""
        admin = self.plane.admin()
        if admin.get(f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{DAEMON_SERVICE_ACCOUNT}") is None:
            return None
        bin_dir = self.work_dir / "imex-bin"
        bin_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
        install_standins(bin_dir)
        daemon_config = self.work_dir / "imex-daemon.kubeconfig"
        token = service_account_token(admin, DAEMON_SERVICE_ACCOUNT)
        write_private(daemon_config, token_kubeconfig(self.plane.server_url, self.plane.pki.ca.cert, token,
                                                      f"system:serviceaccount:{NAMESPACE}:{DAEMON_SERVICE_ACCOUNT}"))
        return ProcessPodSettings(log_root=self.work_dir / "pods", bin_dirs=(bin_dir,),
                                  extra_env={"KUBECONFIG": str(daemon_config),
                                             "DRA_DRIVER_KUBECONFIG": str(daemon_config)},
                                  cdi_dirs=(self.cdi_root,))

    def _start_node(self, node: NodeSpec, index: int, octet: int, runtime: CdiCheckedRuntime,
                    processes: ProcessPodSettings | None) -> None:
        name = node.name
        node_dir = self.work_dir / name
        node_dir.mkdir(parents=True, exist_ok=True)
        pki = self.plane.pki
        client = pki.issue(f"kubelet-{name}", f"system:node:{name}", ("system:nodes",))
        kubelet_kubeconfig = node_dir / "kubelet.kubeconfig"
        write_private(kubelet_kubeconfig, kubeconfig(self.plane.server_url, pki.ca.cert, client,
                                                     f"system:node:{name}"))
        api = k8s_config.new_client_from_config(config_file=str(kubelet_kubeconfig))  # type: ignore[no-untyped-call]
        self._clients.append(api)
        token_config = node_dir / "plugin.kubeconfig"  # written once the Node exists (the token is bound to it)
        plugin = PluginProcess(replace(node, plugin_env={**node.plugin_env,
                                                         "DRA_DRIVER_KUBECONFIG": str(token_config)}), self._host)
        kubelet = KubeletSimulator(
            KubeletConfig(
                node_name=name,
                registry_dir=plugin.registry_dir,
                plugins_dir=plugin.plugins_dir,
                registration=RegistrationConfig(poll_interval_s=2.0),
                node_status=NodeStatusConfig(labels={**GPU_NODE_LABELS, **node.labels}, facts=replace(
                    NodeFacts.from_host(name, runtime.name), internal_ip=node_ip(octet, index))),
                gates=KubeletGates(minor=self.minor),
                pod_cidr=node_pod_cidr(octet, index),
                pod_ip_reserved=(node_ip(octet, index),),
                process_pods=None if processes is None else replace(processes, log_root=plugin.dir / "pods"),
            ),
            runtime,
            api,
        )
        kubelet.start()  # registers the Node first: the plugin's token is bound to it
        self.kubelets[name] = kubelet
        plugin_kubeconfig(self.plane, name, token_config)
        self.plugins[name] = plugin
        plugin.start()
        if wants_compute_domains(node):
            # The chart runs it in the plugin's DaemonSet pod, so as the same ServiceAccount.
            self.cd_plugins[name] = CdPluginProcess(plugin, kubeconfig=token_config, cdi_root=self.cdi_root)
            self.cd_plugins[name].start()

    def resource_slices(self, node: str) -> list[JsonObject]:
        listed = self.plane.admin().get("/apis/resource.k8s.io/v1/resourceslices",
                                        query={"fieldSelector": f"spec.nodeName={node}"}) or {}
        return [s for s in listed.get("items") or [] if (s.get("spec") or {}).get("driver") == self.driver_name]

    def _published(self, node: str) -> bool:
        plugin = self.plugins[node]
        if plugin.process is not None and plugin.process.poll() is not None:
            raise RuntimeError(f"the kubelet plugin of {node} exited {plugin.process.returncode}; see "
                               f"{plugin.log_file}")
        slices = self.resource_slices(node)
        return bool(slices) and len(slices) == slices[0]["spec"]["pool"]["resourceSliceCount"]

    def stop(self) -> None:
        """Plugins, then the kubelets; then the CDI specs of claims still prepared (the nodes go with their pods)."""
        for cd_plugin in self.cd_plugins.values():
            cd_plugin.stop()
        for plugin in self.plugins.values():
            plugin.stop()
        for kubelet in self.kubelets.values():
            kubelet.stop()
        for api in self._clients:
            api.close()  # type: ignore[no-untyped-call]
        self._clients.clear()
        if self.plugins and self.cdi_root.is_dir():
            remove_node_specs(self.cdi_root, self.driver_name, list(self.plugins))
            remove_node_specs(self.cdi_root, CD_DRIVER_NAME, list(self.cd_plugins))
        self.cd_plugins.clear()
        self.plugins.clear()
        self.kubelets.clear()

