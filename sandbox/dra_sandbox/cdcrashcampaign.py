"""The crash campaign's trials on the ComputeDomain driver: SIGKILL-restart trials against the real compute-domain
kubelet plugin with IMEX channel and daemon claims, checking the invariants after every trial. `dra-sandbox
crash-campaign` runs them in one trial loop with the GPU plugin's (crashcampaign.py, crashtrials.run_together).

A trial is one of: prepare a channel claim (the node's one channel) or a daemon claim; prepare a prepared claim
again (the same CDI ids); identical prepares of one claim from several threads at once (a new claim or a prepared
one: every answer is success with the same CDI ids, never "stale"); unprepare one (sometimes from several threads
at once); retry the unprepare of a released claim; the pending-abort sequence of NVIDIA #1162 (the node's IMEX
daemon NotReady, the channel prepare answered "not ready", the pod goes: unprepare, then a stale prepare retry once
IMEX is ready, which must be refused); a daemon claim outside the driver's namespace (a stranger's namespace or
the domain's own; possibly several calls at once), which must be refused every time; or restart the plugin. The
domain and its channel claims are in `team`, the daemon claims and the cliques in the driver's namespace (the
sandbox's release namespace), as the controller makes them. With probability
`crash_probability` the operation runs in a plugin armed to SIGKILL itself at one of its crash points
(`DRA_DRIVER_CRASH_AT`, dra_driver/computedomain/plugin/faults.py) or is SIGKILLed after a random delay; it is then
restarted and the operation retried until it succeeds, as the kubelet retries.

Invariants, from the checkpoint bytes, the CDI dir, the daemon dirs and the Node:
- a prepared claim is PrepareCompleted with its device and has exactly one CDI spec that parses;
- a released claim is absent from the checkpoint (or PrepareAborted) and has no CDI spec;
- the node label `gpu.dra.dev/computeDomain` is the domain's UID exactly while a channel claim is prepared;
- the daemon's config dir exists exactly while a daemon claim is prepared;
- an aborted claim is never prepared by a later (stale) prepare of the same allocation;
- a daemon claim outside the driver's namespace is never prepared: refused with the namespace rule, no record in
  the checkpoint, no CDI spec (and the daemon dir only as a prepared daemon claim of the driver's namespace holds it);
- no temporary file in the plugin dir or the CDI dir.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import yaml

from dra_driver.computedomain.names import (
    CHANNEL_DEVICE,
    DAEMON_DEVICE,
    DOMAIN_LABEL,
    DRIVER_NAME,
    GROUP_VERSION,
    clique_object_name,
)
from dra_driver.computedomain.plugin.checkpoint import DOMAIN_RECORDS, ClaimState
from dra_driver.computedomain.plugin.faults import ENV_VAR, PREPARE_POINTS, UNPREPARE_POINTS
from dra_driver.k8s.client import KubeRest
from dra_driver.kubeletplugin.claimrecord import decode_checkpoint
from dra_sandbox.cluster import ClusterConfig, NodeSpec, SandboxCluster
from dra_sandbox.computedomainplugin import COMPUTE_DOMAIN_NAMESPACE, CdPluginProcess
from dra_sandbox.crashtrials import CrashTrials, TrialsReport
from dra_sandbox.kubelet.draclient import ClaimRef, DraClient, PrepareResult
from dra_sandbox.objects import CLAIM_NAME_MAX, claim_name, create_allocated_claim

NODE = "cd-crash-node"
DOMAIN_NAMESPACE = "team"  # the domain's and its channel claims'
DRIVER_NAMESPACE = COMPUTE_DOMAIN_NAMESPACE  # the daemon claims' and the cliques' (the plugin's --driver-namespace)
FOREIGN_NAMESPACE = "other"  # a stranger's: a daemon claim here must be refused
NAMESPACE_RULE = "must be in the driver's namespace"  # the daemon claim's refusal says this
CONCURRENT_MAX = 12  # identical calls at once
LONG_NAME_SHARE = 0.2  # claims named with the longest name Kubernetes accepts
CLUSTER_UUID = "6c6f2d44-1b7a-4c1e-9a55-0f5e3c2d1a00"
CLIQUE = f"{CLUSTER_UUID}.3"
NODE_FILE = f"""\
name: {NODE}
nvlink: nvswitch
fabric: {{state: completed, clique_id: 3, cluster_uuid: {CLUSTER_UUID}}}
gpus: [{{model: H100-SXM5-80GB, count: 4}}]
"""
CRDS = Path(__file__).resolve().parents[2] / "charts/dra-driver/crds"
CHANNEL_PREPARE = tuple(p for p in PREPARE_POINTS if p != "cd-prepare:after-daemon-dir")
DAEMON_PREPARE = tuple(p for p in PREPARE_POINTS if p != "cd-prepare:after-node-label")
RELEASE = tuple(p for p in UNPREPARE_POINTS if p != "cd-unprepare:after-abort")
ABORT = ("cd-unprepare:after-abort", "cd-unprepare:after-daemon-dir", "cd-unprepare:after-node-label",
         "cd-unprepare:after-cdi")


@dataclass(frozen=True)
class CdCampaignSettings:
    trials: int
    seed: int
    crash_probability: float = 0.5


@dataclass
class CdCampaignReport(TrialsReport):
    long_named: int = 0  # claims named with CLAIM_NAME_MAX bytes

    def summary(self) -> str:
        ops = self.operations_line()
        return (f"compute-domain crash campaign: {self.trials} trials, {self.crashes} SIGKILLs, {self.restarts} "
                f"restarts; {ops}; {self.long_named} claims with {CLAIM_NAME_MAX}-byte names; "
                f"{len(self.violations)} violations")


@dataclass
class Claim:
    ref: ClaimRef
    device: str
    cdi_ids: tuple[str, ...] = ()


def cut_off(error: str | None) -> bool:
    """Whether a call's error is the transport's (the plugin was killed under it), not the plugin's answer."""
    return (error or "").startswith(("NodePrepareResources failed: ", "NodeUnprepareResources failed: "))


def install_domain(rest: KubeRest) -> str:
    """The CRDs, the namespaces, one ComputeDomain and its clique with this node's daemon Ready; returns the
    domain's UID."""
    for crd in ("computedomains.yaml", "computedomaincliques.yaml"):
        rest.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                     body=yaml.safe_load((CRDS / crd).read_text()))
    for namespace in (DOMAIN_NAMESPACE, DRIVER_NAMESPACE, FOREIGN_NAMESPACE):
        if rest.get(f"/api/v1/namespaces/{namespace}") is None:
            rest.request("POST", "/api/v1/namespaces",
                         body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    domain = rest.request("POST", f"/apis/{GROUP_VERSION}/namespaces/{DOMAIN_NAMESPACE}/computedomains", body={
        "apiVersion": GROUP_VERSION, "kind": "ComputeDomain", "metadata": {"name": "crash-domain"},
        "spec": {"numNodes": 1, "channel": {"resourceClaimTemplate": {"name": "imex-channel"}}}})
    uid = str(domain["metadata"]["uid"])
    rest.request("POST", f"/apis/{GROUP_VERSION}/namespaces/{DRIVER_NAMESPACE}/computedomaincliques", body={
        "apiVersion": GROUP_VERSION, "kind": "ComputeDomainClique",
        "metadata": {"name": clique_object_name(uid, CLIQUE), "namespace": DRIVER_NAMESPACE}, "daemons": []})
    return uid


class CdCampaign(CrashTrials[Claim, CdCampaignReport]):
    retry_pause_s = 0.05

    def __init__(self, cluster: SandboxCluster, domain_uid: str, settings: CdCampaignSettings,
                 progress: Callable[[str], None] | None = None) -> None:
        self.plugin: CdPluginProcess = cluster.cd_plugins[NODE]
        super().__init__(self.plugin, CdCampaignReport(), settings.seed, settings.trials, progress)
        self.cluster = cluster
        self.rest = cluster.api
        self.domain_uid = domain_uid
        self.settings = settings
        self.aborted: list[Claim] = []
        self.foreign: list[Claim] = []  # daemon claims outside the driver's namespace: never prepared
        self.set_ready(True)

    # --- the world ------------------------------------------------------------------------------------------------

    def set_ready(self, ready: bool) -> None:
        path = (f"/apis/{GROUP_VERSION}/namespaces/{DRIVER_NAMESPACE}/computedomaincliques/"
                f"{clique_object_name(self.domain_uid, CLIQUE)}")
        clique = self.rest.request("GET", path)
        clique["daemons"] = [{"nodeName": NODE, "ipAddress": "127.0.3.1", "cliqueID": CLIQUE, "index": 0,
                              "status": "Ready" if ready else "NotReady"}]
        self.rest.request("PUT", path, body=clique)

    def new_claim(self, device: str, namespace: str = "") -> Claim:
        """A claim where the controller's templates make it (channel: the domain's namespace; daemon: the
        driver's), or in `namespace`."""
        channel = device == CHANNEL_DEVICE
        kind = "ComputeDomainChannelConfig" if channel else "ComputeDomainDaemonConfig"
        namespace = namespace or (DOMAIN_NAMESPACE if channel else DRIVER_NAMESPACE)
        name = claim_name("cdc", self.rng, LONG_NAME_SHARE)
        self.report.long_named += len(name) == CLAIM_NAME_MAX
        stored = create_allocated_claim(
            self.rest, namespace=namespace, name=name, driver=DRIVER_NAME, pool=NODE, devices=[device],
            config=[{"source": "FromClaim", "requests": [], "opaque": {"driver": DRIVER_NAME, "parameters": {
                "apiVersion": GROUP_VERSION, "kind": kind, "domainID": self.domain_uid}}}])
        return Claim(ClaimRef(namespace, name, stored["metadata"]["uid"]), device)

    # --- the plugin -----------------------------------------------------------------------------------------------

    def _restart(self, env: dict[str, str] | None = None) -> bool:
        """Restart the plugin (armed with `env`); False when the armed point was reached by its own start-up
        recovery (a crash in recovery, which the next start must then finish): it is restarted unarmed."""
        self.report.restarts += 1
        try:
            self.plugin.restart(env)
            return True
        except RuntimeError:
            if self.plugin.alive() or env is None:
                raise
            self.report.crashes += 1
            self.plugin.restart()
            return False

    def _call(self, points: Sequence[str], op: Callable[[DraClient], Any]) -> bool:
        """`op` with a crash armed at random; True when one was armed (a call it cut off fails on the transport).
        Not "the plugin is dead now": a process that killed itself has closed its sockets a moment before waitpid
        reports it, so a call can see the kill while `alive()` still says yes (the disarming restart ends it)."""
        armed = None
        if self.rng.random() < self.settings.crash_probability:
            armed = self.rng.choice(points) if points and self.rng.random() < 0.7 else "random-delay"
            if armed != "random-delay" and not self._restart({ENV_VAR: armed}):
                armed = None
        killer = threading.Timer(self.rng.uniform(0.0, 0.03), self.plugin.kill) if armed == "random-delay" else None
        if killer is not None:
            killer.start()
        with self._client() as client, contextlib.suppress(grpc.RpcError):  # killed mid-call
            op(client)
        if killer is not None:
            killer.cancel()
            killer.join()
        if not self.plugin.alive():
            self.report.crashes += 1
            self._restart()
        elif armed not in (None, "random-delay"):
            self._restart()  # disarm
        return armed is not None

    @staticmethod
    def _concurrently(count: int, call: Callable[[], Any]) -> list[Any]:
        """`call` from `count` threads released together; their answers (None where a thread got none)."""
        start = threading.Barrier(count)
        answers: list[Any] = [None] * count

        def one(i: int) -> None:
            with contextlib.suppress(threading.BrokenBarrierError):
                start.wait(10)
                answers[i] = call()

        threads = [threading.Thread(target=one, args=(i,), name=f"cdc-call-{i}") for i in range(count)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        return answers

    def _prepare_until_ok(self, claim: Claim) -> tuple[str, ...]:
        return tuple(i for d in self._prepared(claim).devices for i in d.cdi_device_ids)

    def _alive(self) -> bool:
        return self.plugin.alive()

    # --- operations -----------------------------------------------------------------------------------------------

    def _held(self, device: str) -> bool:
        return any(c.device == device for c in self.prepared.values())

    def op_prepare_new(self) -> None:
        free = [d for d in (CHANNEL_DEVICE, DAEMON_DEVICE) if not self._held(d)]
        if not free:
            return self.op_unprepare()
        claim = self.new_claim(self.rng.choice(free))
        points = CHANNEL_PREPARE if claim.device == CHANNEL_DEVICE else DAEMON_PREPARE
        self._call(points, lambda c: c.prepare([claim.ref]))
        claim.cdi_ids = self._prepare_until_ok(claim)
        self.prepared[claim.ref.uid] = claim

    def op_prepare_again(self) -> None:
        if not self.prepared:
            return self.op_prepare_new()
        claim = self.prepared[self.rng.choice(sorted(self.prepared))]
        self._call(PREPARE_POINTS, lambda c: c.prepare([claim.ref]))
        again = self._prepare_until_ok(claim)
        if again != claim.cdi_ids:
            self.report.violations.append(f"{claim.ref.name}: prepared again with {again}, first {claim.cdi_ids}")

    def op_concurrent_prepare(self) -> None:
        """Identical prepares of one claim at once (the kubelet's retry overlapping its first call, a hostile
        client), no unprepare: every answer the plugin gave is success with the same CDI ids."""
        free = [d for d in (CHANNEL_DEVICE, DAEMON_DEVICE) if not self._held(d)]
        if free and (not self.prepared or self.rng.random() < 0.6):
            claim, again = self.new_claim(self.rng.choice(free)), False
        elif self.prepared:
            claim, again = self.prepared[self.rng.choice(sorted(self.prepared))], True
        else:
            return self.op_unprepare()
        points = CHANNEL_PREPARE if claim.device == CHANNEL_DEVICE else DAEMON_PREPARE
        answers: list[PrepareResult | None] = []
        count = self.rng.randint(2, CONCURRENT_MAX)
        armed = self._call(points, lambda c: answers.extend(
            self._concurrently(count, lambda: c.prepare([claim.ref])[claim.ref.uid])))
        ids = self._prepare_until_ok(claim)
        if again and ids != claim.cdi_ids:
            self.report.violations.append(f"{claim.ref.name}: prepared again with {ids}, first {claim.cdi_ids}")
        claim.cdi_ids = ids
        self.prepared[claim.ref.uid] = claim
        for answer in answers:
            if answer is None or (armed and cut_off(answer.error)):
                continue
            got = tuple(i for d in answer.devices for i in d.cdi_device_ids)
            if not answer.ok or got != ids:
                self.report.violations.append(f"{claim.ref.name}: one of {count} identical concurrent prepares "
                                              f"answered {answer.error or got}, the claim's CDI ids are {ids}")

    def op_unprepare(self) -> None:
        if not self.prepared:
            return self.op_prepare_new()
        claim = self.prepared.pop(self.rng.choice(sorted(self.prepared)))
        count = 1 if self.rng.random() < 0.7 else self.rng.randint(2, CONCURRENT_MAX)
        errors: list[str | None] = []
        armed = self._call(RELEASE, lambda c: errors.extend(
            self._concurrently(count, lambda: c.unprepare([claim.ref])[claim.ref.uid])))
        self._unprepare_until_ok(claim)
        self.released.append(claim)
        for error in errors:
            if error is not None and not (armed and cut_off(error)):
                self.report.violations.append(f"{claim.ref.name}: one of {count} identical concurrent "
                                              f"unprepares answered {error}")

    def op_foreign_daemon(self) -> None:
        """A daemon claim outside the driver's namespace (a stranger's, or the domain's own) for this domain: it
        would get the domain's read-write /imexd, its identity and the fabric-management capability. Every
        answer is the namespace refusal, the kubelet's unprepare succeeds, and nothing of it is on the node."""
        claim = self.new_claim(DAEMON_DEVICE, self.rng.choice((FOREIGN_NAMESPACE, DOMAIN_NAMESPACE)))
        self.foreign.append(claim)
        answers: list[PrepareResult | None] = []
        count = self.rng.randint(1, 4)
        armed = self._call((), lambda c: answers.extend(
            self._concurrently(count, lambda: c.prepare([claim.ref])[claim.ref.uid])))
        with self._client() as client:
            answers.append(client.prepare([claim.ref])[claim.ref.uid])  # the kubelet's retry
            unprepared = client.unprepare([claim.ref])[claim.ref.uid]
        for answer in answers:
            if answer is not None and not (armed and cut_off(answer.error)) and (
                    answer.ok or NAMESPACE_RULE not in (answer.error or "")):
                self.report.violations.append(f"daemon claim {claim.ref.namespace}/{claim.ref.name} of a domain in "
                                              f"{DOMAIN_NAMESPACE}: prepare answered {answer}")
        if unprepared is not None:
            self.report.violations.append(f"daemon claim {claim.ref.name}: unprepare answered {unprepared}")

    def op_stale_unprepare(self) -> None:
        if not self.released:
            return self.op_unprepare()
        self._unprepare_until_ok(self.rng.choice(self.released))

    def op_pending_abort(self) -> None:
        """NVIDIA #1162: unprepare while the channel prepare waits for IMEX, then a stale prepare retry."""
        if self._held(CHANNEL_DEVICE):
            return self.op_unprepare()
        claim = self.new_claim(CHANNEL_DEVICE)
        self.set_ready(False)
        try:
            with self._client() as client:
                first = client.prepare([claim.ref])[claim.ref.uid]
            if first.ok:
                self.report.violations.append(f"{claim.ref.name}: prepared although the IMEX daemon is NotReady")
            self._call(ABORT, lambda c: c.unprepare([claim.ref]))
            self._unprepare_until_ok(claim)
        finally:
            self.set_ready(True)
        state = self._checkpoint_states().get(claim.ref.uid)
        with self._client() as client:
            stale = client.prepare([claim.ref])[claim.ref.uid]
        if state is ClaimState.PREPARE_ABORTED and (stale.ok or "stale prepare" not in (stale.error or "")):
            self.report.violations.append(f"{claim.ref.name}: aborted, yet a stale prepare answered {stale}")
        if stale.ok:
            # Only possible when the plugin was killed before the abort was recorded (as if the unprepare had never
            # come): the claim is prepared now, so it is the kubelet's to unprepare.
            claim.cdi_ids = tuple(i for d in stale.devices for i in d.cdi_device_ids)
            self.prepared[claim.ref.uid] = claim
        else:
            self.aborted.append(claim)

    def op_restart(self) -> None:
        self._restart_gracefully_or_crash()
        for claim in list(self.prepared.values()):
            again = self._prepare_until_ok(claim)
            if again != claim.cdi_ids:
                self.report.violations.append(f"{claim.ref.name}: after a restart {again}, first {claim.cdi_ids}")

    # --- invariants -----------------------------------------------------------------------------------------------

    def _checkpoint_states(self) -> dict[str, ClaimState]:
        path = self.plugin.plugin_dir / "checkpoint.json"
        if not path.exists():
            return {}
        return {u: r.state for u, r in decode_checkpoint(path.read_bytes(), DOMAIN_RECORDS).claims.items()}

    def _spec(self, uid: str) -> Path:
        return self.cluster.cdi_root / f"k8s.{DRIVER_NAME}-claim_{NODE}_{uid}.json"

    def check(self, when: str) -> None:
        found: list[str] = []
        path = self.plugin.plugin_dir / "checkpoint.json"
        claims = dict(decode_checkpoint(path.read_bytes(), DOMAIN_RECORDS).claims) if path.exists() else {}
        for uid, claim in self.prepared.items():
            record = claims.get(uid)
            if record is None or record.state is not ClaimState.PREPARE_COMPLETED:
                found.append(f"prepared claim {claim.ref.name} is {record.state if record else 'missing'}")
            elif [d.device for d in record.devices] != [claim.device]:
                found.append(f"{claim.ref.name} records {[d.device for d in record.devices]}")
            try:
                json.loads(self._spec(uid).read_bytes())
            except (OSError, ValueError) as exc:
                found.append(f"prepared claim {claim.ref.name}: CDI spec {exc}")
        for claim in self.released + self.aborted:
            record = claims.get(claim.ref.uid)
            if record is not None and record.state is not ClaimState.PREPARE_ABORTED:
                found.append(f"released claim {claim.ref.name} is {record.state} in the checkpoint")
            if self._spec(claim.ref.uid).exists():
                found.append(f"released claim {claim.ref.name} still has a CDI spec")
        for claim in self.foreign:
            if claim.ref.uid in claims:
                found.append(f"daemon claim {claim.ref.namespace}/{claim.ref.name} outside the driver's namespace is "
                             f"{claims[claim.ref.uid].state} in the checkpoint")
            if self._spec(claim.ref.uid).exists():
                found.append(f"daemon claim {claim.ref.namespace}/{claim.ref.name} outside the driver's namespace "
                             "has a CDI spec")
        extra = {u for u, r in claims.items() if r.state is not ClaimState.PREPARE_ABORTED} - set(self.prepared)
        if extra:
            found.append(f"the checkpoint holds claims nobody prepared: {sorted(extra)}")
        node = self.rest.request("GET", f"/api/v1/nodes/{NODE}")
        label = (node["metadata"].get("labels") or {}).get(DOMAIN_LABEL)
        want = self.domain_uid if self._held(CHANNEL_DEVICE) else None
        if label != want:
            found.append(f"node label {DOMAIN_LABEL} is {label!r}, expected {want!r}")
        config_dir = self.plugin.plugin_dir / "domains" / self.domain_uid
        if config_dir.exists() != self._held(DAEMON_DEVICE):
            found.append(f"daemon config dir exists={config_dir.exists()}, a daemon claim prepared="
                         f"{self._held(DAEMON_DEVICE)}")
        temps = [p.name for d in (self.plugin.plugin_dir, self.cluster.cdi_root) if d.exists()
                 for p in d.iterdir() if ".tmp" in p.name]
        if temps:
            found.append(f"temporary files left: {temps}")
        self.report_new(when, found)

    def operations(self) -> Sequence[tuple[Callable[[], None], int]]:
        return ((self.op_prepare_new, 4), (self.op_prepare_again, 2), (self.op_concurrent_prepare, 2),
                (self.op_unprepare, 3), (self.op_stale_unprepare, 1), (self.op_pending_abort, 2),
                (self.op_foreign_daemon, 1), (self.op_restart, 1))


def cd_cluster_config(work: Path) -> ClusterConfig:
    work.mkdir(parents=True, exist_ok=True)
    node_file = work / "cd-node.yaml"
    node_file.write_text(NODE_FILE)
    return ClusterConfig(work_dir=work, nodes=[NodeSpec(NODE, f"fake:{node_file}", mig_mode="none",
                                                        compute_domains=True)], runtime="cdi-check")
