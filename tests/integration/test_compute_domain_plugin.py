"""The compute-domain kubelet plugin on the sandbox (API server + kubelet simulator), on a fake NVML node in an
NVLink clique: it registers as its own driver and publishes channel-0/daemon-0; the kubelet prepares a channel claim
(retryable while the node's clique entry is NotReady, then with the channel device in the CDI spec and the node
labelled for the domain) and a daemon claim (config dir, env, mount, fabric capability), and unprepares both; an
unprepare of a claim still waiting for IMEX aborts it and a stale prepare retry is refused (NVIDIA #1162). Its
/healthz follows its sockets and its /metrics counts the prepares."""

from __future__ import annotations

import dataclasses
import json
import shutil
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from dra_driver.computedomain.names import (
    CHANNEL_DEVICE,
    DAEMON_DEVICE,
    DOMAIN_LABEL,
    DRIVER_NAME,
    GROUP_VERSION,
    clique_object_name,
)
from dra_driver.computedomain.plugin.app import CdPluginSettings, ComputeDomainPlugin
from dra_driver.computedomain.plugin.checkpoint import DOMAIN_RECORDS, ClaimState
from dra_driver.computedomain.plugin.faults import CdFaultPoints
from dra_driver.computedomain.plugin.hostdevices import FAKE_CAPS_MAJOR, FAKE_CHANNEL_MAJOR, FAKE_FABRIC_MGMT_MINOR
from dra_driver.computedomain.plugin.metrics import PREPARE_ERROR_REASONS
from dra_driver.k8s.client import KubeRest
from dra_driver.kubeletplugin.claimrecord import decode_checkpoint
from dra_driver.nvml.factory import open_backend
from dra_driver.observability.endpoint import HttpEndpoint
from dra_sandbox.apiserver import ApiServer
from dra_sandbox.kubelet import Backoff, KubeletConfig, KubeletSimulator, PodSyncConfig, RegistrationConfig
from dra_sandbox.kubelet.draclient import ClaimRef
from dra_sandbox.objects import create_allocated_claim
from dra_sandbox.runtime import CdiCheckedRuntime
from tests.polling import wait_for
from tests.sandbox.test_kubelet_fakeplugin import short_tmpdir

ROOT = Path(__file__).resolve().parents[2]
CLUSTER_UUID = "6c6f2d44-1b7a-4c1e-9a55-0f5e3c2d1a00"
CLIQUE = f"{CLUSTER_UUID}.7"
DRIVER_NS = "dra-driver"
NODE_FILE = f"""\
name: cd-node
nvlink: nvswitch
fabric: {{state: completed, clique_id: 7, cluster_uuid: {CLUSTER_UUID}}}
gpus: [{{model: H100-SXM5-80GB, count: 4}}]
"""


class CdNode:
    def __init__(self, server: ApiServer, base: Path) -> None:
        self.rest: KubeRest = server.rest()
        self.node = f"cd-{uuid.uuid4().hex[:6]}"
        self.registry, plugins = base / "registry", base / "plugins"
        self.plugin_dir = plugins / DRIVER_NAME
        self.cdi = base / "cdi"
        (base / "boot_id").write_text("boot-1\n")
        (base / "node.yaml").write_text(NODE_FILE)
        self.nvml = open_backend(f"fake:{base / 'node.yaml'}", driver_root="/")
        self.nvml.init()
        for crd in ("computedomains.yaml", "computedomaincliques.yaml"):
            self.rest.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                              body=yaml.safe_load((ROOT / "charts/dra-driver/crds" / crd).read_text()))
        self.kubelet = KubeletSimulator(
            KubeletConfig(
                node_name=self.node, registry_dir=self.registry, plugins_dir=plugins,
                registration=RegistrationConfig(poll_interval_s=0.2, dial_timeout_s=2.0,
                                                backoff=Backoff(0.05, 2.0, 0.2), health_reopen_s=0.1),
                pods=PodSyncConfig(resync_interval_s=0.05, backoff=Backoff(0.1, 2.0, 0.4), wiping_delay_s=0.3,
                                   watch_timeout_s=5, request_timeout_s=10.0),
            ),
            CdiCheckedRuntime([self.cdi]),
            server.api_client(),
        )
        self.settings = CdPluginSettings(
            node_name=self.node, plugin_dir=self.plugin_dir, registry_dir=self.registry, cdi_root=self.cdi,
            state_dir=self.plugin_dir, proc_root=base / "proc", driver_namespace=DRIVER_NS, fake=True,
            boot_id_path=base / "boot_id", readiness_wait=0.5, shutdown_grace=1.0, kube_version=(1, 35),
            healthz_port=0, metrics_port=0,  # any free port each (.healthz.port, .metrics_server.port)
        )
        self.plugin = ComputeDomainPlugin(self.settings, nvml=self.nvml, rest=self.rest)

    def domain(self, namespace: str = "default") -> dict[str, Any]:
        return self.rest.request("POST", f"/apis/{GROUP_VERSION}/namespaces/{namespace}/computedomains", body={
            "apiVersion": GROUP_VERSION, "kind": "ComputeDomain", "metadata": {"name": f"cd-{uuid.uuid4().hex[:5]}"},
            "spec": {"numNodes": 1, "channel": {"resourceClaimTemplate": {"name": "imex-channel"}}},
        })

    def namespace(self, namespace: str) -> None:
        if self.rest.get(f"/api/v1/namespaces/{namespace}") is None:
            self.rest.request("POST", "/api/v1/namespaces",
                              body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})

    def clique(self, domain_uid: str, status: str) -> None:
        self.namespace(DRIVER_NS)
        path = f"/apis/{GROUP_VERSION}/namespaces/{DRIVER_NS}/computedomaincliques"
        name = clique_object_name(domain_uid, CLIQUE)
        body: dict[str, Any] = {"apiVersion": GROUP_VERSION, "kind": "ComputeDomainClique",
                "metadata": {"name": name, "namespace": DRIVER_NS},
                "daemons": [{"nodeName": self.node, "ipAddress": "127.0.1.1", "cliqueID": CLIQUE, "index": 0,
                             "status": status}]}
        existing = self.rest.get(f"{path}/{name}")
        if existing is None:
            self.rest.request("POST", path, body=body)
        else:
            body["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"]
            self.rest.request("PUT", f"{path}/{name}", body=body)

    def claim(self, namespace: str, device: str, config: dict[str, Any]) -> ClaimRef:
        name = f"c-{uuid.uuid4().hex[:6]}"
        self.namespace(namespace)
        stored = create_allocated_claim(
            self.rest, namespace=namespace, name=name, driver=DRIVER_NAME, pool=self.node, devices=[device],
            config=[{"source": "FromClaim", "requests": [],
                     "opaque": {"driver": DRIVER_NAME, "parameters": {"apiVersion": GROUP_VERSION, **config}}}],
        )
        return ClaimRef(namespace, name, stored["metadata"]["uid"])

    def label(self) -> str | None:
        node = self.rest.get(f"/api/v1/nodes/{self.node}") or {}
        return ((node.get("metadata") or {}).get("labels") or {}).get(DOMAIN_LABEL)

    def spec(self, uid: str) -> dict[str, Any]:
        return dict(json.loads((self.cdi / f"k8s.{DRIVER_NAME}-claim_{self.node}_{uid}.json").read_bytes()))

    def state(self, uid: str) -> ClaimState | None:
        path = self.plugin_dir / "checkpoint.json"
        record = decode_checkpoint(path.read_bytes(), DOMAIN_RECORDS).claims.get(uid) if path.exists() else None
        return record.state if record is not None else None


@pytest.fixture
def cd() -> Iterator[CdNode]:
    base = short_tmpdir()
    with ApiServer() as server:
        node = CdNode(server, base)
        node.kubelet.start()
        try:
            wait_for(lambda: node.rest.get(f"/api/v1/nodes/{node.node}") is not None, what="the Node registered")
            node.plugin.start()
            yield node
        finally:
            node.plugin.stop()
            node.kubelet.stop()
            node.nvml.shutdown()
    shutil.rmtree(base, ignore_errors=True)


def test_channel_and_daemon_claims_prepare_and_unprepare(cd: CdNode) -> None:
    registered = wait_for(lambda: cd.kubelet.plugins.get(DRIVER_NAME), what="the compute-domain driver registered")
    slices = wait_for(lambda: cd.rest.request("GET", "/apis/resource.k8s.io/v1/resourceslices",
                                              query={"fieldSelector": f"spec.driver={DRIVER_NAME}"})["items"],
                      what="the pool published")
    devices = {d["name"]: d for d in slices[0]["spec"]["devices"]}
    assert slices[0]["spec"]["pool"]["name"] == cd.node
    assert devices[CHANNEL_DEVICE]["attributes"] == {"type": {"string": "channel"}, "id": {"int": 0},
                                                     "cliqueID": {"string": CLIQUE}}
    assert devices[DAEMON_DEVICE]["attributes"]["type"] == {"string": "daemon"}
    assert "bindingConditions" not in devices[CHANNEL_DEVICE]  # 1.35: prepare checks readiness itself

    domain = cd.domain()
    uid, ns, name = domain["metadata"]["uid"], domain["metadata"]["namespace"], domain["metadata"]["name"]
    channel = cd.claim(ns, CHANNEL_DEVICE, {"kind": "ComputeDomainChannelConfig", "domainID": uid})

    # No daemon Ready yet: retryable, the node is labelled (so the daemon gets scheduled), the claim PrepareStarted.
    cd.clique(uid, "NotReady")
    first = registered.client.prepare([channel])[channel.uid]
    assert first.error and f"not ready in ComputeDomain {ns}/{name}" in first.error
    assert cd.label() == uid and cd.state(channel.uid) is ClaimState.PREPARE_STARTED

    cd.clique(uid, "Ready")
    ok = registered.client.prepare([channel])[channel.uid]
    assert ok.error is None, ok.error
    cdi_id = f"k8s.{DRIVER_NAME}/claim={channel.uid}-{CHANNEL_DEVICE}"
    assert [d.cdi_device_ids for d in ok.devices] == [(cdi_id,)]
    spec = cd.spec(channel.uid)
    edits = spec["devices"][0]["containerEdits"]
    assert edits["deviceNodes"] == [{"path": "/dev/nvidia-caps-imex-channels/channel0", "type": "c",
                                     "major": FAKE_CHANNEL_MAJOR, "minor": 0, "fileMode": 0o666}]
    assert spec["kind"] == f"k8s.{DRIVER_NAME}/claim" and cd.state(channel.uid) is ClaimState.PREPARE_COMPLETED

    daemon = cd.claim(DRIVER_NS, DAEMON_DEVICE, {"kind": "ComputeDomainDaemonConfig", "domainID": uid})
    result = registered.client.prepare([daemon])[daemon.uid]
    assert result.error is None, result.error
    daemon_edits = cd.spec(daemon.uid)["devices"][0]["containerEdits"]
    config_dir = cd.plugin_dir / "domains" / uid
    assert sorted(daemon_edits["env"]) == sorted([f"CLIQUE_ID={CLIQUE}", f"COMPUTE_DOMAIN_UUID={uid}",
                                                  f"COMPUTE_DOMAIN_NAME={name}", f"COMPUTE_DOMAIN_NAMESPACE={ns}"])
    assert daemon_edits["mounts"] == [{"hostPath": str(config_dir), "containerPath": "/imexd",
                                       "options": ["rw", "nosuid", "nodev", "bind"]}]
    assert daemon_edits["deviceNodes"] == [{"path": f"/dev/nvidia-caps/nvidia-cap{FAKE_FABRIC_MGMT_MINOR}",
                                            "type": "c", "major": FAKE_CAPS_MAJOR, "minor": FAKE_FABRIC_MGMT_MINOR}]
    assert (config_dir / "imexd.cfg.tmpl").is_file()

    assert registered.client.unprepare([daemon])[daemon.uid] is None
    assert not config_dir.exists() and cd.label() == uid  # the channel claim still holds the node
    assert registered.client.unprepare([channel])[channel.uid] is None
    assert cd.label() is None and cd.state(channel.uid) is None
    assert list(cd.cdi.glob("*.json")) == []


def test_a_claim_in_another_namespace_than_its_domain_is_refused(cd: CdNode) -> None:
    registered = wait_for(lambda: cd.kubelet.plugins.get(DRIVER_NAME), what="registered")
    uid = cd.domain()["metadata"]["uid"]
    claim = cd.claim("other", CHANNEL_DEVICE, {"kind": "ComputeDomainChannelConfig", "domainID": uid})
    error = registered.client.prepare([claim])[claim.uid].error
    assert error and "in another namespace" in error
    assert cd.label() is None and cd.state(claim.uid) is None  # nothing left behind


def concurrently(count: int, call: Callable[[int], Any]) -> list[Any]:
    """`call(i)` from `count` threads released together; their answers (or what they raised)."""
    start = threading.Barrier(count)
    answers: list[Any] = [None] * count

    def one(i: int) -> None:
        start.wait(10)
        try:
            answers[i] = call(i)
        except Exception as exc:
            answers[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(t.is_alive() for t in threads)
    return answers


@pytest.mark.parametrize("device", [CHANNEL_DEVICE, DAEMON_DEVICE])
def test_identical_concurrent_prepares_all_get_the_same_answer(cd: CdNode, device: str) -> None:
    """20 NodePrepareResources calls for one claim at once, no unprepare: every one succeeds with the same CDI id
    (before the per-claim lock 3-17 of them got a false "stale prepare ... already aborted"), and the node holds
    exactly one prepared record, one CDI spec and, for the daemon, its config dir."""
    registered = wait_for(lambda: cd.kubelet.plugins.get(DRIVER_NAME), what="registered")
    uid = cd.domain()["metadata"]["uid"]
    cd.clique(uid, "Ready")
    kind = "ComputeDomainChannelConfig" if device == CHANNEL_DEVICE else "ComputeDomainDaemonConfig"
    claim = cd.claim("default" if device == CHANNEL_DEVICE else DRIVER_NS, device, {"kind": kind, "domainID": uid})
    answers = concurrently(20, lambda _: registered.client.prepare([claim])[claim.uid])
    cdi_id = f"k8s.{DRIVER_NAME}/claim={claim.uid}-{device}"
    assert [(a.error, [d.cdi_device_ids for d in a.devices]) for a in answers] == [(None, [(cdi_id,)])] * 20
    checkpoint = decode_checkpoint((cd.plugin_dir / "checkpoint.json").read_bytes(), DOMAIN_RECORDS)
    assert list(checkpoint.claims) == [claim.uid]
    record = checkpoint.claims[claim.uid]
    assert record.state is ClaimState.PREPARE_COMPLETED and [d.cdi_device_ids for d in record.devices] == [(cdi_id,)]
    assert [p.name for p in cd.cdi.iterdir()] == [f"k8s.{DRIVER_NAME}-claim_{cd.node}_{claim.uid}.json"]
    assert [d["name"] for d in cd.spec(claim.uid)["devices"]] == [f"{claim.uid}-{device}"]
    config_dir = cd.plugin_dir / "domains" / uid
    assert config_dir.is_dir() == (device == DAEMON_DEVICE)
    assert cd.label() == (uid if device == CHANNEL_DEVICE else None)
    # Identical concurrent unprepares: all succeed, and nothing is left.
    assert concurrently(20, lambda _: registered.client.unprepare([claim])[claim.uid]) == [None] * 20
    assert cd.state(claim.uid) is None and list(cd.cdi.iterdir()) == [] and not config_dir.exists()
    assert cd.label() is None


def test_concurrent_prepares_while_imex_is_not_ready_are_retryable_never_stale(cd: CdNode) -> None:
    """The kubelet's retry can overlap a call still waiting for IMEX: the calls queue on the claim, each answers
    "not ready" (or "still running", when the queue is longer than its wait), none says the claim was aborted."""
    registered = wait_for(lambda: cd.kubelet.plugins.get(DRIVER_NAME), what="registered")
    uid = cd.domain()["metadata"]["uid"]
    cd.clique(uid, "NotReady")
    claim = cd.claim("default", CHANNEL_DEVICE, {"kind": "ComputeDomainChannelConfig", "domainID": uid})
    answers = concurrently(6, lambda _: registered.client.prepare([claim])[claim.uid])
    for answer in answers:
        assert answer.error and ("not ready in ComputeDomain" in answer.error or "still running" in answer.error)
        assert "stale" not in answer.error
    assert cd.state(claim.uid) is ClaimState.PREPARE_STARTED and cd.label() == uid
    cd.clique(uid, "Ready")
    assert registered.client.prepare([claim])[claim.uid].error is None
    assert registered.client.unprepare([claim])[claim.uid] is None and cd.label() is None


def test_identical_prepares_on_two_plugin_instances_of_the_node_agree(cd: CdNode) -> None:
    """A rolling update runs the old and the new plugin side by side on one plugin dir: the claim lock is per
    process, so what keeps their calls of one claim apart is the checkpoint (every write of a claim's record
    expects the record the call decided on). Two engines here are two instances (separate locks and stores); the
    second one stops at its crash points where the test says."""
    from dra_driver.computedomain.plugin.checkpoint import CHECKPOINT_NAME, DOMAIN_RECORDS, Checkpoint
    from dra_driver.computedomain.plugin.engine import ComputeDomainEngine
    from dra_driver.kubeletplugin.checkpoint import CheckpointStore
    from dra_driver.kubeletplugin.claimrecord import ClaimCodec
    from dra_driver.kubeletplugin.claims import KubeClaimSource
    from dra_driver.kubeletplugin.driver import ClaimRef as PluginClaimRef
    from dra_driver.kubeletplugin.statedirs import OPERATION_LOCK_NAME, OperationLock

    wait_for(lambda: cd.kubelet.plugins.get(DRIVER_NAME), what="registered")
    first = cd.plugin.engine
    pause = PausingPoints()
    second = ComputeDomainEngine(
        first.settings, claims=KubeClaimSource(cd.rest),
        store=CheckpointStore[Checkpoint](cd.plugin_dir / CHECKPOINT_NAME, ClaimCodec(DOMAIN_RECORDS),
                                          boot_id_path=cd.settings.boot_id_path),
        specs=first.specs, tools=dataclasses.replace(first.tools, faults=pause), clique_id=lambda: cd.plugin.clique_id,
        lock=OperationLock(cd.plugin_dir / OPERATION_LOCK_NAME))
    try:
        uid = cd.domain()["metadata"]["uid"]
        cd.clique(uid, "Ready")
        claim = cd.claim("default", CHANNEL_DEVICE, {"kind": "ComputeDomainChannelConfig", "domainID": uid})
        ref = PluginClaimRef(claim.namespace, claim.name, claim.uid)
        answers = concurrently(16, lambda i: (first if i % 2 else second).prepare([ref])[ref.uid])
        cdi_id = f"k8s.{DRIVER_NAME}/claim={claim.uid}-{CHANNEL_DEVICE}"
        assert [(a.error, [d.cdi_device_ids for d in a.devices]) for a in answers] == [("", [(cdi_id,)])] * 16
        assert cd.state(claim.uid) is ClaimState.PREPARE_COMPLETED and cd.spec(claim.uid) and cd.label() == uid
        errors = concurrently(8, lambda i: (first if i % 2 else second).unprepare([ref])[ref.uid])
        assert errors == [""] * 8
        assert cd.state(claim.uid) is None and list(cd.cdi.iterdir()) == [] and cd.label() is None

        # The second instance has written the CDI spec and is about to record PrepareCompleted when the first one
        # gets the kubelet's unprepare (#1162 across instances): the abort wins, the late write is refused and
        # takes its spec back, nothing of the claim is left on the node.
        late = cd.claim("default", CHANNEL_DEVICE, {"kind": "ComputeDomainChannelConfig", "domainID": uid})
        late_ref = PluginClaimRef(late.namespace, late.name, late.uid)
        pause.at = "cd-prepare:after-cdi"
        answer: list[Any] = []
        pending = threading.Thread(target=lambda: answer.append(second.prepare([late_ref])[late.uid]))
        pending.start()
        assert pause.reached_it.wait(20)
        assert first.unprepare([late_ref])[late.uid] == ""
        pause.go.set()
        pending.join(20)
        assert "stale prepare" in answer[0].error and answer[0].devices == ()
        assert cd.state(late.uid) is ClaimState.PREPARE_ABORTED
        assert list(cd.cdi.iterdir()) == [] and cd.label() is None
    finally:
        pause.go.set()
        second.close()


class PausingPoints(CdFaultPoints):
    """Stops the calling thread at one crash point (instead of killing the process) until `go` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.at = ""
        self.reached_it, self.go = threading.Event(), threading.Event()

    def reached(self, point: str) -> None:
        if point == self.at:
            self.reached_it.set()
            self.go.wait(20)


@pytest.mark.parametrize("namespace", ["other", "default"])  # a stranger's namespace, and the domain's own
def test_a_daemon_claim_outside_the_drivers_namespace_is_refused_and_leaves_nothing(cd: CdNode, namespace: str) -> None:
    """The daemon device is the domain's IMEX config dir read-write, its identity and the fabric-management
    capability: only the controller's daemon claims (the driver's namespace) get it."""
    registered = wait_for(lambda: cd.kubelet.plugins.get(DRIVER_NAME), what="registered")
    domain = cd.domain()
    uid, name = domain["metadata"]["uid"], domain["metadata"]["name"]
    cd.clique(uid, "Ready")
    claim = cd.claim(namespace, DAEMON_DEVICE, {"kind": "ComputeDomainDaemonConfig", "domainID": uid})
    for _ in range(2):  # the kubelet's retry gets the same answer
        error = registered.client.prepare([claim])[claim.uid].error
        assert error and f"ResourceClaim {namespace}/{claim.name}" in error and f"ComputeDomain default/{name}" in error
        assert f"must be in the driver's namespace {DRIVER_NS}, not {namespace}" in error
        assert cd.state(claim.uid) is None and list(cd.cdi.iterdir()) == []
        assert not (cd.plugin_dir / "domains").exists() and cd.label() is None
    assert registered.client.unprepare([claim])[claim.uid] is None  # the kubelet's unprepare: nothing to do
    # The controller's daemon claim in the driver's namespace is still prepared.
    ok = cd.claim(DRIVER_NS, DAEMON_DEVICE, {"kind": "ComputeDomainDaemonConfig", "domainID": uid})
    assert registered.client.prepare([ok])[ok.uid].error is None
    assert registered.client.unprepare([ok])[ok.uid] is None


def test_unprepare_of_a_pending_prepare_aborts_it_and_a_stale_retry_is_refused(cd: CdNode) -> None:
    """NVIDIA #1162: the pod goes while its channel claim still waits for IMEX; a late prepare retry must not
    prepare it (and leave the channel and the node label behind)."""
    registered = wait_for(lambda: cd.kubelet.plugins.get(DRIVER_NAME), what="registered")
    domain = cd.domain()
    uid = domain["metadata"]["uid"]
    cd.clique(uid, "NotReady")
    claim = cd.claim("default", CHANNEL_DEVICE, {"kind": "ComputeDomainChannelConfig", "domainID": uid})
    assert registered.client.prepare([claim])[claim.uid].error
    assert cd.label() == uid
    assert registered.client.unprepare([claim])[claim.uid] is None
    assert cd.label() is None and cd.state(claim.uid) is ClaimState.PREPARE_ABORTED
    cd.clique(uid, "Ready")  # IMEX would now be ready: the stale retry must still not prepare
    stale = registered.client.prepare([claim])[claim.uid].error
    assert stale and "stale prepare" in stale and "already aborted" in stale
    assert cd.label() is None and list(cd.cdi.glob("*.json")) == []


def test_with_binding_conditions_in_the_allocation_prepare_does_not_wait_for_imex(cd: CdNode) -> None:
    """1.36+ mode: the scheduler waited for compute-domain.gpu.dra.dev/imex-ready before binding the pod, so the
    clique entry is not consulted (here it is NotReady and prepare still succeeds at once)."""
    registered = wait_for(lambda: cd.kubelet.plugins.get(DRIVER_NAME), what="registered")
    uid = cd.domain()["metadata"]["uid"]
    cd.clique(uid, "NotReady")
    cd.namespace("default")
    stored = create_allocated_claim(
        cd.rest, namespace="default", name=f"c-{uuid.uuid4().hex[:6]}", driver=DRIVER_NAME, pool=cd.node,
        devices=[CHANNEL_DEVICE],
        config=[{"source": "FromClaim", "requests": [], "opaque": {"driver": DRIVER_NAME, "parameters": {
            "apiVersion": GROUP_VERSION, "kind": "ComputeDomainChannelConfig", "domainID": uid}}}],
        result_fields=[{"bindingConditions": ["compute-domain.gpu.dra.dev/imex-ready"],
                        "bindingFailureConditions": ["compute-domain.gpu.dra.dev/imex-failed"]}],
    )
    claim = ClaimRef("default", stored["metadata"]["name"], stored["metadata"]["uid"])
    result = registered.client.prepare([claim])[claim.uid]
    assert result.error is None, result.error
    assert cd.label() == uid and cd.state(claim.uid) is ClaimState.PREPARE_COMPLETED
    assert registered.client.unprepare([claim])[claim.uid] is None and cd.label() is None


def http_get(endpoint: HttpEndpoint | None, path: str) -> tuple[int, str]:
    assert endpoint is not None
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{endpoint.port}{path}", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_healthz_answers_once_registered_and_metrics_count_the_prepares(cd: CdNode) -> None:
    registered = wait_for(lambda: cd.kubelet.plugins.get(DRIVER_NAME), what="the compute-domain driver registered")
    assert http_get(cd.plugin.healthz, "/healthz") == (200, "ok\n")
    code, before = http_get(cd.plugin.metrics_server, "/metrics")
    series = samples(before)
    op = "dra_driver_compute_domain_claim_operations_total"
    assert code == 200 and series[(op, (("operation", "prepare"), ("outcome", "success")))] == 0
    assert {r for (name, labels) in series if name == "dra_driver_compute_domain_prepare_errors_total"
            for _, r in labels} == set(PREPARE_ERROR_REASONS)  # every reason from the start, at zero
    assert not any(name.startswith("dra_driver_claim_") for name, _ in series)  # nothing of the GPU plugin's

    uid = cd.domain()["metadata"]["uid"]
    cd.clique(uid, "NotReady")
    channel = cd.claim("default", CHANNEL_DEVICE, {"kind": "ComputeDomainChannelConfig", "domainID": uid})
    assert registered.client.prepare([channel])[channel.uid].error  # IMEX not ready: retryable
    cd.clique(uid, "Ready")
    assert registered.client.prepare([channel])[channel.uid].error is None
    # The healthz port serves the same registry as the metrics port.
    for endpoint in (cd.plugin.metrics_server, cd.plugin.healthz):
        code, text = http_get(endpoint, "/metrics")
        after = samples(text)
        assert code == 200
        assert after[(op, (("operation", "prepare"), ("outcome", "success")))] == 1
        assert after[(op, (("operation", "prepare"), ("outcome", "error")))] == 1
        assert after[("dra_driver_compute_domain_prepare_errors_total", (("reason", "not-ready"),))] == 1
        assert after[("dra_driver_compute_domain_prepare_errors_total", (("reason", "invalid"),))] == 0
        assert after[("dra_driver_compute_domain_prepare_seconds_count", (("outcome", "success"),))] == 1
        assert after[("dra_driver_compute_domain_prepared_claims", ())] == 1

    assert registered.client.unprepare([channel])[channel.uid] is None
    after = samples(http_get(cd.plugin.metrics_server, "/metrics")[1])
    assert after[(op, (("operation", "unprepare"), ("outcome", "success")))] == 1
    assert after[("dra_driver_compute_domain_prepared_claims", ())] == 0

    # /healthz asks the sockets: closed, it says so (the kubelet could not reach the plugin either).
    cd.plugin.server.stop(grace=0.5)
    code, reason = http_get(cd.plugin.healthz, "/healthz")
    assert code == 503 and "gRPC probe failed" in reason


def test_a_corrupt_checkpoint_is_quarantined_with_a_node_event_and_the_plugin_starts(cd: CdNode) -> None:
    """The same hook as the GPU plugin's (kubeletplugin/nodeevents.py): CheckpointQuarantined names the file."""
    from dra_driver.kubeletplugin.nodeevents import CHECKPOINT_QUARANTINED

    cd.plugin.stop()
    (cd.plugin_dir / "checkpoint.json").write_bytes(b"\x00\x01 not a checkpoint")
    cd.plugin = ComputeDomainPlugin(cd.settings, nvml=cd.nvml, rest=cd.rest)
    cd.plugin.start()
    wait_for(lambda: cd.kubelet.plugins.get(DRIVER_NAME), what="the compute-domain driver registered again")
    [quarantined] = list(cd.plugin_dir.glob("checkpoint.json.corrupt-*"))

    def events() -> list[dict[str, Any]]:
        return [e for e in cd.rest.request("GET", "/api/v1/namespaces/default/events")["items"]
                if e["reason"] == CHECKPOINT_QUARANTINED and e["involvedObject"]["name"] == cd.node]

    [event] = wait_for(events, what="the CheckpointQuarantined Event")
    assert event["type"] == "Warning" and str(quarantined) in event["message"] and DRIVER_NAME in event["message"]
    assert event["involvedObject"]["kind"] == "Node" and event["involvedObject"].get("uid")


def test_a_plugin_started_before_the_driver_waits_alive_but_not_ready_then_registers() -> None:
    """As the GPU plugin (tests/integration/test_driver_wait.py): started on a node whose NVIDIA driver is not loaded
    yet, it neither exits (the container would crash-loop) nor registers; /livez 200, /readyz 503 with the reason.
    Once the driver is loaded (by another process, through the fake's shared state) it registers and publishes."""
    from dataclasses import replace

    from dra_driver.nvidiadriver.wait import DriverWaitSettings
    from dra_driver.nvml.fake.backend import FakeNvml

    base = short_tmpdir()
    with ApiServer() as server:
        node = CdNode(server, base)
        spec = f"fake:{base / 'node.yaml'},state={base / 'nvml-state.json'},driver=absent"
        nvml = open_backend(spec, driver_root="/")
        outside = open_backend(spec, driver_root="/")  # the node's kernel driver, as the Operator's pod loads it
        assert isinstance(outside, FakeNvml)
        plugin = ComputeDomainPlugin(replace(node.settings, driver_wait=DriverWaitSettings(max_interval=0.2)),
                                     nvml=nvml, rest=node.rest)
        node.kubelet.start()
        starting = threading.Thread(target=plugin.start, name="cd-start", daemon=True)
        try:
            wait_for(lambda: node.rest.get(f"/api/v1/nodes/{node.node}") is not None, what="the Node registered")
            starting.start()
            code, body = wait_for(
                lambda: r if (r := http_get_or_none(plugin.healthz, "/readyz")) and "not checked yet" not in r[1]
                else None, what="/readyz with the first check's reason")
            assert code == 503 and body.startswith("driver not ready: ") and "DRIVER_NOT_LOADED" in body, body
            assert http_get(plugin.healthz, "/healthz") == (code, body)
            assert http_get(plugin.healthz, "/livez")[0] == 200  # alive: the kubelet must not restart it
            assert starting.is_alive() and not plugin.server.registration_socket.exists()
            assert not node.plugin_dir.exists()  # nothing on the node touched while waiting
            assert driver_slices(node) == []

            outside.load_driver()
            starting.join(30)
            assert not starting.is_alive()
            wait_for(lambda: node.kubelet.plugins.get(DRIVER_NAME), what="registered once the driver is there")
            wait_for(lambda: driver_slices(node) or None, what="channel-0 and daemon-0 published")
            assert wait_for(lambda: http_get(plugin.healthz, "/readyz") == (200, "ok\n") or None, what="ready")
        finally:
            plugin.stop()
            starting.join(10)
            node.kubelet.stop()
            node.nvml.shutdown()
    shutil.rmtree(base, ignore_errors=True)


def test_a_stop_while_waiting_for_the_driver_ends_the_wait_and_leaves_nothing() -> None:
    from dataclasses import replace

    from dra_driver.nvidiadriver.wait import DriverWaitSettings

    base = short_tmpdir()
    with ApiServer() as server:
        node = CdNode(server, base)
        nvml = open_backend(f"fake:{base / 'node.yaml'},state={base / 'nvml-state.json'},driver=absent",
                            driver_root="/")
        plugin = ComputeDomainPlugin(replace(node.settings, driver_wait=DriverWaitSettings(max_interval=30.0)),
                                     nvml=nvml, rest=node.rest)
        starting = threading.Thread(target=plugin.start, name="cd-start", daemon=True)
        starting.start()
        try:
            wait_for(lambda: (r := http_get_or_none(plugin.healthz, "/readyz")) and "DRIVER_NOT_LOADED" in r[1],
                     what="waiting")
            plugin.stop()  # what SIGTERM does (run_until_signal sets stop_requested first)
            starting.join(5)  # the wait ends at once, not after its 30 s back-off
            assert not starting.is_alive()
            assert not node.plugin_dir.exists() and driver_slices(node) == []
        finally:
            plugin.stop()
            node.nvml.shutdown()
    shutil.rmtree(base, ignore_errors=True)


def http_get_or_none(endpoint: HttpEndpoint | None, path: str) -> tuple[int, str] | None:
    """None while the endpoint does not answer yet."""
    try:
        return http_get(endpoint, path)
    except OSError:
        return None


def driver_slices(node: CdNode) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = node.rest.request(
        "GET", "/apis/resource.k8s.io/v1/resourceslices", query={"fieldSelector": f"spec.driver={DRIVER_NAME}"}
    )["items"]
    return found
