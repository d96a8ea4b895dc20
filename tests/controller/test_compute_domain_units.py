"""The pure parts of the ComputeDomain controller: status from cliques, the one-domain-per-clique rule, the
binding decisions and the status.devices they write, the daemon pod's failure reasons."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from dra_driver.computedomain import names
from dra_driver.computedomain.model import AllocationMode, ComputeDomain, ComputeDomainClique, DomainNode
from dra_driver.controller.computedomains import binding, objects, reasons, status

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def cd(uid: str = "u1", num_nodes: int = 2) -> ComputeDomain:
    return ComputeDomain("team", f"cd-{uid}", uid, num_nodes, "tpl", AllocationMode.SINGLE)


def node(name: str, ready: bool = True, clique: str = "c.1") -> DomainNode:
    return DomainNode(name, "127.0.0.2", clique, 0, names.STATUS_READY if ready else names.STATUS_NOT_READY)


def clique(uid: str, *daemons: DomainNode, cid: str = "c.1") -> ComputeDomainClique:
    return ComputeDomainClique("dra", names.clique_object_name(uid, cid), daemons)


@pytest.mark.parametrize(("daemons", "num_nodes", "expected", "reason"), [
    ((), 0, "Ready", reasons.ALL_READY),  # NVIDIA's rule: nothing awaited, nothing not ready
    ((node("a"),), 2, "NotReady", reasons.WAITING),
    ((node("a"), node("b", ready=False)), 2, "NotReady", reasons.NODES_NOT_READY),
    ((node("a"), node("b")), 2, "Ready", reasons.ALL_READY),
    ((node("a"), node("b"), node("c")), 2, "Ready", reasons.ALL_READY),  # more than numNodes is fine
])
def test_domain_status(daemons: tuple[DomainNode, ...], num_nodes: int, expected: str, reason: str) -> None:
    got = status.domain_status(cd(num_nodes=num_nodes), [clique("u1", *daemons)])
    assert (got.status, got.reason) == (expected, reason)
    assert [n.name for n in got.nodes] == sorted(n.name for n in daemons)


def test_refusals_win_over_readiness() -> None:
    ready = [clique("u1", node("a"), node("b"))]
    conflict = status.CliqueConflict("c.1", "u0", "team/old")
    assert status.domain_status(cd(), ready, conflict=conflict).reason == reasons.CLIQUE_IN_USE
    assert status.domain_status(cd(), ready, refusal="taken").reason == reasons.TEMPLATE_CONFLICT


def test_pruning_keeps_entries_with_a_pod() -> None:
    c = clique("u1", node("a"), node("b"))
    assert status.pruned(c, ["a", "b"]) is None
    kept = status.pruned(c, ["b", "z"])
    assert kept is not None and [d.name for d in kept] == ["b"]


def test_the_oldest_domain_with_a_daemon_holds_the_clique() -> None:
    old, young, idle = (status.Domain(cd(u), t) for u, t in (
        ("u2", "2026-01-01T00:00:00Z"), ("u1", "2026-02-01T00:00:00Z"), ("u0", "2025-01-01T00:00:00Z")))
    cliques = [clique("u1", node("a")), clique("u2", node("b")), clique("u0"), clique("u3", node("c"))]
    owners = status.clique_owners([old, young, idle], cliques)
    assert owners["c.1"].uid == "u2"  # u0 is older but has no daemon there; u3 is not a live domain
    assert status.conflict_of(old, owners, cliques) is None
    conflict = status.conflict_of(young, owners, cliques)
    assert conflict == status.CliqueConflict("c.1", "u2", "team/cd-u2")
    # Another clique is no conflict.
    assert status.conflict_of(young, owners, [clique("u1", node("a"), cid="c.2"), *cliques[1:]]) is None


def test_status_patch_keeps_the_transition_time_and_writes_nothing_when_equal() -> None:
    wanted = status.domain_status(cd(num_nodes=1), [clique("u1", node("a"))])
    obj: dict[str, Any] = {"metadata": {"generation": 3}, "status": {}}
    patch = status.status_patch(obj, wanted, "2026-12-01T12:00:00Z")
    assert patch["status"] == "Ready" and patch["nodes"][0]["name"] == "a"
    assert patch["conditions"][0]["observedGeneration"] == 3
    obj["status"] = patch
    assert status.status_patch(obj, wanted, "2026-12-01T13:00:00Z") == {}
    later = status.domain_status(cd(num_nodes=1), [clique("u1", node("a"), node("b", ready=False))])
    changed = status.status_patch(obj, later, "2026-12-01T13:00:00Z")
    assert changed["conditions"][0]["lastTransitionTime"] == "2026-12-01T13:00:00Z"


def claim(*, conditions: list[dict[str, Any]] | None = None, node_selector: bool = True,
          stamp: str = "2026-12-01T12:00:00Z") -> dict[str, Any]:
    allocation: dict[str, Any] = {"devices": {"results": [
        {"request": "gpu", "driver": "gpu.dra.dev", "pool": "n1", "device": "gpu-0"},
        {"request": "channel", "driver": names.DRIVER_NAME, "pool": "n1", "device": names.CHANNEL_DEVICE,
         "bindingConditions": [names.READY_CONDITION], "bindingFailureConditions": [names.FAILED_CONDITION]}],
        "config": [{"source": "FromClaim", "requests": ["channel"], "opaque": {"driver": names.DRIVER_NAME,
                    "parameters": {"kind": names.CHANNEL_CONFIG_KIND, "domainID": "u1"}}}]},
        "allocationTimestamp": stamp}
    if node_selector:
        allocation["nodeSelector"] = {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}]}
    devices = [{"driver": "gpu.dra.dev", "pool": "n1", "device": "gpu-0", "conditions": [{"type": "Ready"}]}]
    if conditions is not None:
        devices.append({"driver": names.DRIVER_NAME, "pool": "n1", "device": names.CHANNEL_DEVICE,
                        "conditions": conditions})
    return {"metadata": {"namespace": "team", "name": "w", "uid": "c1", "resourceVersion": "7", "generation": 1},
            "status": {"allocation": allocation, "devices": devices}}


def test_channel_claims_read_node_domain_and_state() -> None:
    [ch] = binding.channel_claims(claim())
    assert (ch.node, ch.domain_uid, ch.pool, ch.device) == ("node-a", "u1", "n1", names.CHANNEL_DEVICE)
    assert ch.allocated_at == NOW and not ch.settled
    assert binding.channel_claims(claim(node_selector=False))[0].node == "n1"  # the pool is the node
    done = binding.channel_claims(claim(conditions=[{"type": names.READY_CONDITION, "status": "True"}]))
    assert done[0].ready and done[0].settled
    assert binding.channel_claims({"metadata": {}, "status": {}}) == []


def _decide(**overrides: Any) -> binding.Decision:
    [ch] = binding.channel_claims(claim())
    args: dict[str, Any] = {"domain_known": True, "node_label": None, "clique_owner_uid": None, "clique_owner": "",
                            "entry": None, "pod_failure": "", "now": NOW, "timeout_s": 300.0}
    args.update(overrides)
    return binding.decide(ch, **args)


def test_binding_decisions() -> None:
    assert _decide() == binding.Decision(binding.Verdict.WAIT, label=True)
    assert _decide(node_label="u1") == binding.Decision(binding.Verdict.WAIT, label=False)
    assert _decide(entry=node("node-a")).verdict is binding.Verdict.READY
    assert _decide(entry=node("node-a", ready=False)).verdict is binding.Verdict.WAIT
    assert _decide(node_label="u9").reason == reasons.NODE_IN_USE
    assert _decide(clique_owner_uid="u9", clique_owner="team/x").reason == reasons.CLIQUE_IN_USE
    assert _decide(clique_owner_uid="u1").verdict is binding.Verdict.WAIT  # its own clique
    assert _decide(domain_known=False).reason == reasons.NO_DOMAIN
    assert _decide(pod_failure="CrashLoopBackOff").reason == reasons.DAEMON_FAILED
    assert _decide(now=NOW + timedelta(seconds=301)).reason == reasons.DAEMON_TIMEOUT
    assert _decide(now=NOW + timedelta(seconds=299)).verdict is binding.Verdict.WAIT


def test_the_written_devices_keep_everything_else() -> None:
    obj = claim(conditions=[{"type": "Ready", "status": "True"}])
    [ch] = binding.channel_claims(obj)
    ready = binding.Decision(binding.Verdict.READY, reason="IMEXDaemonReady", message="ok")
    devices = binding.devices_with(obj, ch, ready, "2026-12-01T12:00:05Z")
    assert devices[0] == obj["status"]["devices"][0]  # another driver's entry, as read
    assert [c["type"] for c in devices[1]["conditions"]] == ["Ready", names.READY_CONDITION]  # the plugin's stays
    assert devices[1]["conditions"][1]["status"] == "True" and devices[1]["conditions"][1]["observedGeneration"] == 1
    fresh = claim()
    [ch] = binding.channel_claims(fresh)
    failed = binding.devices_with(fresh, ch, binding.Decision(binding.Verdict.FAILED, reason="X", message="m"), "t")
    assert failed[1] == {"driver": names.DRIVER_NAME, "pool": "n1", "device": names.CHANNEL_DEVICE, "conditions": [
        {"type": names.FAILED_CONDITION, "status": "True", "reason": "X", "message": "m", "lastTransitionTime": "t",
         "observedGeneration": 1}]}


@pytest.mark.parametrize(("pod_status", "found"), [
    ({"phase": "Running"}, ""),
    ({"phase": "Failed", "reason": "Evicted"}, "Evicted"),
    ({"phase": "Running", "containerStatuses": [{"name": "d", "state": {"waiting": {"reason": "ImagePullBackOff"}}}]},
     "ImagePullBackOff"),
    ({"phase": "Pending", "containerStatuses": [{"name": "d", "state": {"waiting": {"reason": "ContainerCreating"}}}]},
     ""),
])
def test_pod_failure(pod_status: dict[str, Any], found: str) -> None:
    got = binding.pod_failure([{"metadata": {"name": "p"}, "status": pod_status}])
    assert (found in got) if found else got == ""


def test_the_daemonset_template_hash_follows_the_image() -> None:
    a = objects.daemon_set(cd(), objects.DaemonSetSettings(namespace="dra", image="img:1"))
    b = objects.daemon_set(cd(), objects.DaemonSetSettings(namespace="dra", image="img:2"))
    key = objects.TEMPLATE_HASH_ANNOTATION
    assert a["metadata"]["annotations"][key] != b["metadata"]["annotations"][key]
    assert a["metadata"]["name"] == names.daemon_object_name("u1")
    assert "serviceAccountName" not in a["spec"]["template"]["spec"]
