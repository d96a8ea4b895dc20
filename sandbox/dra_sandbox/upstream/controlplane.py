"""Upstream's control plane as local processes: etcd, kube-apiserver, kube-controller-manager and kube-scheduler of
one release, built by `dra_sandbox.upstream.build` (docs/upstream.md "The control plane").

Addresses: the control plane owns one loopback address `127.<b>.0.<d>` for its whole life (a lock file held by
this process, `AddressLease`), and its servers listen there on their usual ports (etcd 2379/2380, kube-apiserver
6443, kube-controller-manager 10257, kube-scheduler 10259). kube-apiserver cannot listen on port 0 (its
--secure-port refuses 0) nor take a socket from its parent, so no port is chosen here and bound there later: the
address is ours alone among sandboxes (the lock), and nothing else binds a `127.<b>.0.<d>` of ours (the sandbox's
pod and node addresses are `127.<o>.<n>.<x>` with n >= 1). A stranger listening on a wildcard address at one of those
ports makes the server fail to bind, which start() reports naming the port.

Flags follow a kubeadm cluster (authorization Node,RBAC; admission: the release's default plugins plus
NodeRestriction; request-header authentication with a front-proxy CA; service-account issuer and keys; the
controller-manager signing CSRs with the cluster CA) and `FEATURE_GATES` / `RUNTIME_CONFIG` below turn on what the
driver's features need beyond the release's defaults (docs/upstream.md "Feature gates").
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from types import MappingProxyType
from typing import IO

import yaml

from dra_driver.k8s.client import ApiError, KubeRest, connect
from dra_sandbox.children import terminate
from dra_sandbox.paths import Below
from dra_sandbox.polling import wait_for
from dra_sandbox.startstop import StartStop
from dra_sandbox.upstream.build import DEFAULT_MINOR, ReleaseBinaries
from dra_sandbox.upstream.pki import Pki, kubeconfig, make_pki, write_private

ETCD_CLIENT_PORT = 2379
ETCD_PEER_PORT = 2380
APISERVER_PORT = 6443
CONTROLLER_MANAGER_PORT = 10257
SCHEDULER_PORT = 10259
WEBHOOK_PORT = 9443  # the chart's controller, run beside the control plane (install.py), serves its webhook here
PORTS = (ETCD_CLIENT_PORT, ETCD_PEER_PORT, APISERVER_PORT, CONTROLLER_MANAGER_PORT, SCHEDULER_PORT, WEBHOOK_PORT)

SERVICE_CIDR = "10.96.0.0/12"  # kubeadm's default; the first address is the `kubernetes` Service's ClusterIP
CLUSTER_CIDR = "10.244.0.0/16"  # nodes get spec.podCIDR from it (--allocate-node-cidrs), for the node's CNI

# Gates the driver's features need that are off by default in the release (docs/upstream.md "Feature gates"; the
# stages are read from each tag's pkg/features/kube_features.go). A gate that is on by default is not repeated; a gate
# the release does not know is not passed (the components refuse unknown gates).
FEATURE_GATES: Mapping[str, Mapping[str, bool]] = MappingProxyType({
    "1.34": MappingProxyType({"DRAPartitionableDevices": True, "DRAConsumableCapacity": True,
                              "DRAExtendedResource": True, "DRADeviceTaints": True,
                              "DRADeviceBindingConditions": True, "ResourceHealthStatus": True}),
    "1.35": MappingProxyType({"DRAPartitionableDevices": True, "DRAConsumableCapacity": True,
                              "DRAExtendedResource": True, "DRADeviceTaints": True, "DRADeviceTaintRules": True,
                              "DRADeviceBindingConditions": True, "ResourceHealthStatus": True}),
    "1.36": MappingProxyType({"DRADeviceTaintRules": True, "DRAListTypeAttributes": True}),
    "1.37": MappingProxyType({"DRAListTypeAttributes": True, "DRADeviceCompatibilityGroups": True}),
})
# API versions off by default that those gates need: DeviceTaintRule is resource.k8s.io/v1alpha3 in 1.34-1.35 and
# v1beta2 in 1.36 (both disabled by default); 1.37 serves it in v1.
RUNTIME_CONFIG: Mapping[str, str] = MappingProxyType({
    "1.34": "resource.k8s.io/v1alpha3=true",
    "1.35": "resource.k8s.io/v1alpha3=true",
    "1.36": "resource.k8s.io/v1beta2=true",
    "1.37": "",
})

START_TIMEOUT_S = 120.0  # each server, on a loaded 2-core machine
STOP_TIMEOUT_S = 20.0


class ControlPlaneError(RuntimeError):
    pass


def feature_gates_flag(minor: str) -> str:
    return ",".join(f"{name}={str(on).lower()}" for name, on in sorted(FEATURE_GATES.get(minor, {}).items()))


# --- the address ---------------------------------------------------------------------------------------------


def _lock_dir() -> Path:
    return Path(tempfile.gettempdir()) / "dra-sandbox-controlplane-addresses"


def _bindable(address: str, port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind((address, port))
        except OSError:
            return False
    return True


@dataclass
class AddressLease:
    """A loopback address held for one control plane: an exclusive lock on `<tmp>/dra-sandbox-controlplane-addresses/
    <address>.lock` while this object lives (the kernel drops the lock with the process, so a killed owner frees it)."""

    address: str
    _handle: IO[bytes] | None = field(repr=False)

    @classmethod
    def acquire(cls, second_octets: Sequence[int] = tuple(range(240, 250)), ports: Sequence[int] = PORTS
                ) -> AddressLease:
        directory = _lock_dir()
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        candidates = [f"127.{b}.0.{d}" for b in second_octets for d in range(1, 255)]
        start = secrets.randbelow(len(candidates))
        for address in candidates[start:] + candidates[:start]:
            handle = open(directory / f"{address}.lock", "a+b")  # noqa: SIM115 (held until release)
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.close()
                continue
            # Ours among sandboxes now; a stranger already listening on a port there (a wildcard listener) would
            # make a server fail, so such an address is passed over.
            if all(_bindable(address, port) for port in ports):
                return cls(address, handle)
            fcntl.flock(handle, fcntl.LOCK_UN)
            handle.close()
        raise ControlPlaneError(f"no free control-plane address in 127.{second_octets[0]}-{second_octets[-1]}.0.x: "
                                f"ports {', '.join(map(str, ports))} are taken (by a wildcard listener?)")

    def release(self) -> None:
        if self._handle is not None:
            fcntl.flock(self._handle, fcntl.LOCK_UN)
            self._handle.close()
            self._handle = None


# --- processes -----------------------------------------------------------------------------------------------


@dataclass
class Server:
    """One upstream process, its argv and log."""

    name: str
    argv: list[str]
    log: Path
    env: Mapping[str, str] | None = None  # None: this process's environment
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                            env=self.env, start_new_session=True)

    def check_running(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            raise ControlPlaneError(f"{self.name} exited with {self.process.returncode}; its log "
                                    f"{self.log}:\n{self.log_tail()}")

    def log_tail(self, size: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-size:]
        except OSError:
            return ""

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        terminate(self.process, timeout)


@dataclass(frozen=True)
class ControlPlaneConfig:
    work_dir: Path  # everything of this control plane: pki/, etcd data, kubeconfigs, logs
    binaries: ReleaseBinaries
    verbosity: int = 1
    extra_feature_gates: Mapping[str, bool] = field(default_factory=dict)
    # More API versions for --runtime-config (e.g. "resource.k8s.io/v1alpha3=true" for ResourcePoolStatusRequest).
    extra_runtime_config: tuple[str, ...] = ()


class ControlPlane(StartStop):
    """start() brings up etcd, kube-apiserver, kube-controller-manager and kube-scheduler and waits until each works
    (etcd /health, the API server's /readyz, the Leases of the two controllers); stop() ends them in reverse."""

    def __init__(self, config: ControlPlaneConfig) -> None:
        self.config = config
        self.minor = config.binaries.release.minor or DEFAULT_MINOR
        self.dir = config.work_dir
        self.pki = Pki(self.dir / "pki")
        self.lease: AddressLease | None = None
        self.servers: list[Server] = []
        self.timings: dict[str, float] = {}  # seconds from start() until each server was ready
        self._admin: KubeRest | None = None

    # Paths and URLs -------------------------------------------------------------------------------------------
    @property
    def address(self) -> str:
        if self.lease is None:
            raise ControlPlaneError("the control plane is not started")
        return self.lease.address

    @property
    def server_url(self) -> str:
        return f"https://{self.address}:{APISERVER_PORT}"

    admin_kubeconfig = Below("admin.kubeconfig", base="dir")

    def child_pids(self) -> dict[str, int]:
        return {f"upstream/{s.name}": s.process.pid for s in self.servers if s.process and s.process.poll() is None}

    # Start / stop ---------------------------------------------------------------------------------------------
    def start(self, say: Callable[[str], None] = lambda _: None) -> None:
        with self.starting(self.timings) as ready:
            self._prepare()
            say(f"upstream: control plane {self.config.binaries.release.kubernetes} on {self.address}")
            self._start_etcd()
            ready("etcd")
            self._start_apiserver()
            ready("kube-apiserver")
            self._bootstrap_rbac()
            self._start_controllers()
            ready("controllers")

    def stop(self) -> None:
        if self._admin is not None:
            self._admin.close()
            self._admin = None
        for server in reversed(self.servers):
            server.stop()
        self.servers = []
        if self.lease is not None:
            self.lease.release()
            self.lease = None

    def _prepare(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.dir.chmod(0o700)
        (self.dir / "logs").mkdir(exist_ok=True)
        self.lease = AddressLease.acquire()
        shutil.rmtree(self.pki.root, ignore_errors=True)
        service_ip = str(next(ipaddress.ip_network(SERVICE_CIDR).hosts()))
        names = ["kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"]
        make_pki(self.pki.root, [self.address, "127.0.0.1", service_ip, "localhost", *names])
        for name, user in (("admin", "kubernetes-admin"), ("controller-manager", "system:kube-controller-manager"),
                           ("scheduler", "system:kube-scheduler")):
            write_private(self.dir / f"{name}.kubeconfig",
                          kubeconfig(self.server_url, self.pki.ca.cert, self.pki.pair(name), user))

    def _server(self, name: str, argv: list[str]) -> Server:
        log = self.dir / "logs" / f"{name}.log"
        log.write_bytes(b"")
        server = Server(name, argv, log)
        self.servers.append(server)
        server.start()
        return server

    def _wait(self, server: Server, ready: Callable[[], bool], what: str) -> None:
        def check() -> bool:
            server.check_running()
            return ready()

        try:
            wait_for(check, START_TIMEOUT_S, what, interval=0.2)
        except TimeoutError as exc:
            raise ControlPlaneError(f"{exc}; {server.log}:\n{server.log_tail()}") from None

    def _gates(self) -> list[str]:
        gates = dict(FEATURE_GATES.get(self.minor, {}))
        gates.update(self.config.extra_feature_gates)
        flag = ",".join(f"{k}={str(v).lower()}" for k, v in sorted(gates.items()))
        return [f"--feature-gates={flag}"] if flag else []

    def _start_etcd(self) -> None:
        data = self.dir / "etcd"
        shutil.rmtree(data, ignore_errors=True)
        client = f"http://{self.address}:{ETCD_CLIENT_PORT}"
        peer = f"http://{self.address}:{ETCD_PEER_PORT}"
        server = self._server("etcd", [
            str(self.config.binaries.path("etcd")), "--name=controlplane", f"--data-dir={data}",
            f"--listen-client-urls={client}", f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=controlplane={peer}", "--initial-cluster-state=new", "--log-level=warn",
            # A sandbox's data lives for hours and is thrown away: no fsync per write (the 2-core machines'
            # disks would otherwise dominate every API write; upstream's integration tests do the same).
            "--unsafe-no-fsync",
        ])

        def healthy() -> bool:
            try:
                with urllib.request.urlopen(f"{client}/health", timeout=2) as response:  # noqa: S310 (our http URL)
                    return bool(json.loads(response.read()).get("health") == "true")
            except (OSError, ValueError):
                return False

        self._wait(server, healthy, f"etcd to serve on {client}")

    def _start_apiserver(self) -> None:
        pki = self.pki
        configs = (RUNTIME_CONFIG.get(self.minor, ""), *self.config.extra_runtime_config)
        runtime_config = ",".join(c for c in configs if c)
        argv = [
            str(self.config.binaries.path("kube-apiserver")),
            f"--advertise-address={self.address}", f"--bind-address={self.address}",
            f"--secure-port={APISERVER_PORT}",
            # The `kubernetes` Service's endpoints would be the advertised address, which may not be a loopback one
            # ("may not be in the loopback range"); with no kube-proxy here nothing could route them anyway.
            "--endpoint-reconciler-type=none",
            f"--etcd-servers=http://{self.address}:{ETCD_CLIENT_PORT}",
            f"--tls-cert-file={pki.pair('apiserver').cert}", f"--tls-private-key-file={pki.pair('apiserver').key}",
            f"--client-ca-file={pki.ca.cert}",
            f"--kubelet-client-certificate={pki.pair('apiserver-kubelet-client').cert}",
            f"--kubelet-client-key={pki.pair('apiserver-kubelet-client').key}",
            f"--kubelet-certificate-authority={pki.ca.cert}",
            "--kubelet-preferred-address-types=InternalIP,ExternalIP,Hostname",
            f"--service-account-key-file={pki.service_account_pub}",
            f"--service-account-signing-key-file={pki.service_account_key}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=Node,RBAC",
            # kubeadm's: the release's default admission plugins (NamespaceLifecycle, LimitRanger, ServiceAccount,
            # ..., MutatingAdmissionPolicy/ValidatingAdmissionPolicy, the webhooks, ResourceQuota) plus NodeRestriction.
            "--enable-admission-plugins=NodeRestriction",
            "--allow-privileged=true",
            "--enable-bootstrap-token-auth=true",
            f"--requestheader-client-ca-file={pki.front_proxy_ca.cert}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={pki.pair('front-proxy-client').cert}",
            f"--proxy-client-key-file={pki.pair('front-proxy-client').key}",
            "--profiling=false",
            f"--v={self.config.verbosity}",
            *self._gates(),
        ]
        if runtime_config:
            argv.append(f"--runtime-config={runtime_config}")
        server = self._server("kube-apiserver", argv)

        def ready() -> bool:
            try:
                return self.admin().request_bytes("GET", "/readyz") == b"ok"
            except ApiError:
                return False

        self._wait(server, ready, f"kube-apiserver /readyz on {self.server_url}")

    def admin(self) -> KubeRest:
        """A client as kubernetes-admin (system:masters), through the product's own client and kubeconfig loader."""
        if self._admin is None:
            self._admin = connect(str(self.admin_kubeconfig), timeout=30.0, component="dra-sandbox")
        return self._admin

    def _bootstrap_rbac(self) -> None:
        """What kubeadm adds beyond the bootstrap policy: the API server may use the kubelets' API (logs, exec)."""
        self.admin().request("POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", body={
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "kube-apiserver-kubelet-client"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": "system:kubelet-api-admin"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                          "name": "kube-apiserver-kubelet-client"}],
        })

    def _start_controllers(self) -> None:
        pki = self.pki
        kcm_config = self.dir / "controller-manager.kubeconfig"
        kcm = self._server("kube-controller-manager", [
            str(self.config.binaries.path("kube-controller-manager")),
            f"--kubeconfig={kcm_config}", f"--authentication-kubeconfig={kcm_config}",
            f"--authorization-kubeconfig={kcm_config}",
            f"--bind-address={self.address}", f"--secure-port={CONTROLLER_MANAGER_PORT}",
            f"--client-ca-file={pki.ca.cert}", f"--requestheader-client-ca-file={pki.front_proxy_ca.cert}",
            f"--cluster-signing-cert-file={pki.ca.cert}", f"--cluster-signing-key-file={pki.ca.key}",
            f"--root-ca-file={pki.ca.cert}", f"--service-account-private-key-file={pki.service_account_key}",
            "--use-service-account-credentials=true", "--controllers=*,bootstrapsigner,tokencleaner",
            "--leader-elect=true", f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--allocate-node-cidrs=true", f"--cluster-cidr={CLUSTER_CIDR}",
            "--profiling=false", f"--v={self.config.verbosity}", *self._gates(),
        ])
        scheduler_config = self.dir / "scheduler.yaml"
        scheduler_kubeconfig = self.dir / "scheduler.kubeconfig"
        scheduler_config.write_text(yaml.safe_dump({
            "apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
            "clientConnection": {"kubeconfig": str(scheduler_kubeconfig)},
            "leaderElection": {"leaderElect": True},
        }))
        scheduler = self._server("kube-scheduler", [
            str(self.config.binaries.path("kube-scheduler")), f"--config={scheduler_config}",
            f"--authentication-kubeconfig={scheduler_kubeconfig}",
            f"--authorization-kubeconfig={scheduler_kubeconfig}",
            f"--bind-address={self.address}", f"--secure-port={SCHEDULER_PORT}",
            f"--client-ca-file={pki.ca.cert}", f"--requestheader-client-ca-file={pki.front_proxy_ca.cert}",
            f"--v={self.config.verbosity}", *self._gates(),
        ])
        for server, lease in ((kcm, "kube-controller-manager"), (scheduler, "kube-scheduler")):
            self._wait(server, partial(self._leads, lease), f"{server.name} to hold its Lease")

    def _leads(self, lease: str) -> bool:
        with contextlib.suppress(ApiError):
            obj = self.admin().get(f"/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/{lease}")
            spec = obj.get("spec") if obj else None
            return isinstance(spec, dict) and bool(spec.get("holderIdentity"))
        return False


def is_upstream_process(pid: int, cache: Path) -> bool:
    """A live process of a control plane: one of the cached upstream binaries, or the chart's controller run beside
    it (install.py). A PID in children.json may have been reused since."""
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    controller = b"dra_driver.cli" in argv and b"controller" in argv and any(
        a.startswith(b"--webhook-bind-address=") for a in argv)
    return Path(exe).is_relative_to(cache) or controller
