"""Pure pod-lifecycle decisions: which claims, when to prepare, which CDI ids, what to unprepare."""

from __future__ import annotations

from typing import Any

import pytest

from dra_sandbox.kubelet import lifecycle as lc
from dra_sandbox.kubelet.draclient import ClaimRef, PreparedDevice

POD_UID = "pod-uid-1"


def pod(**kwargs: Any) -> lc.PodView:
    base: dict[str, Any] = {
        "namespace": "ns",
        "name": "p",
        "uid": POD_UID,
        "node_name": "node-1",
        "resource_claims": (lc.PodClaimSource("gpu", template_name="gpu-tmpl"), lc.PodClaimSource("shared", "shared")),
        "claim_statuses": {"gpu": "p-gpu-abc"},
        "containers": (
            lc.ContainerView("main", "img", (lc.ClaimUse("gpu"), lc.ClaimUse("shared", "nic"))),
            lc.ContainerView("sidecar", "img"),
        ),
    }
    base.update(kwargs)
    return lc.PodView(**base)


def claim(name: str, uid: str, drivers: tuple[str, ...] = ("gpu.dev",), allocated: bool = True,
          reserved: tuple[str, ...] = (POD_UID,)) -> lc.ClaimView:
    devices = tuple(lc.AllocatedDevice("req", d, "pool", f"dev-{i}") for i, d in enumerate(drivers))
    return lc.ClaimView(ClaimRef("ns", name, uid), allocated, devices, frozenset(reserved))


def claims_map(*claims: lc.ClaimView) -> dict[tuple[str, str], lc.ClaimView]:
    return {(c.ref.namespace, c.ref.name): c for c in claims}


def test_claim_names_direct_and_template() -> None:
    names = lc.claim_names_for_pod(pod())
    assert names.waiting is None and dict(names.names) == {"gpu": "p-gpu-abc", "shared": "shared"}


def test_claim_names_waits_for_generated_claim() -> None:
    names = lc.claim_names_for_pod(pod(claim_statuses={}))
    assert names.waiting is not None and "pod claim 'gpu'" in names.waiting


def test_template_claim_not_needed_is_skipped() -> None:
    names = lc.claim_names_for_pod(pod(claim_statuses={"gpu": None}))
    assert dict(names.names) == {"shared": "shared"}


@pytest.mark.parametrize(
    ("claims", "drivers", "needle"),
    [
        (claims_map(claim("shared", "u2")), {"gpu.dev"}, "does not exist yet"),
        (claims_map(claim("p-gpu-abc", "u1", allocated=False), claim("shared", "u2")), {"gpu.dev"},
         "not allocated"),
        (claims_map(claim("p-gpu-abc", "u1", reserved=("other",)), claim("shared", "u2")), {"gpu.dev"},
         "not reserved for this pod"),
        (claims_map(claim("p-gpu-abc", "u1"), claim("shared", "u2", ("nic.dev",))), {"gpu.dev"},
         "DRA driver nic.dev is not registered"),
    ],
)
def test_plan_waits(claims: dict[tuple[str, str], lc.ClaimView], drivers: set[str], needle: str) -> None:
    plan = lc.plan_prepare(pod(), claims, drivers)
    assert not plan.ready and plan.waiting is not None and needle in plan.waiting


def test_plan_groups_claims_by_driver_and_skips_prepared() -> None:
    gpu = claim("p-gpu-abc", "u1")
    shared = claim("shared", "u2", ("gpu.dev", "nic.dev"))
    plan = lc.plan_prepare(pod(), claims_map(gpu, shared), {"gpu.dev", "nic.dev"})
    assert plan.ready
    assert dict(plan.calls) == {
        "gpu.dev": (ClaimRef("ns", "p-gpu-abc", "u1"), ClaimRef("ns", "shared", "u2")),
        "nic.dev": (ClaimRef("ns", "shared", "u2"),),
    }
    assert dict(plan.claims) == {"gpu": gpu, "shared": shared}
    # Already prepared (claim, driver) pairs are not sent again.
    again = lc.plan_prepare(pod(), claims_map(gpu, shared), {"gpu.dev", "nic.dev"}, [("u1", "gpu.dev"),
                                                                                     ("u2", "nic.dev")])
    assert dict(again.calls) == {"gpu.dev": (ClaimRef("ns", "shared", "u2"),)}


def test_cdi_ids_follow_container_claims_and_requests() -> None:
    gpu = claim("p-gpu-abc", "u1")
    shared = claim("shared", "u2", ("gpu.dev", "nic.dev"))
    prepared: dict[str, dict[str, tuple[PreparedDevice, ...]]] = {
        "u1": {"gpu.dev": (PreparedDevice(("gpu",), "pool", "gpu-0", ("v/gpu=u1-0",)),)},
        "u2": {
            "gpu.dev": (PreparedDevice(("other",), "pool", "gpu-1", ("v/gpu=u2-0",)),),
            "nic.dev": (
                PreparedDevice(("nic/fast",), "pool", "nic-0", ("v/nic=u2-0", "v/nic=u2-0b")),
                PreparedDevice((), "pool", "nic-1", ("v/nic=u2-1", "v/gpu=u1-0")),  # serves every request
            ),
        },
    }
    main, sidecar = pod().containers
    ids = lc.cdi_ids_for_container(main, {"gpu": gpu, "shared": shared}, prepared)
    # All of "gpu"; of "shared" only devices serving request "nic" (incl. subrequest nic/fast); no duplicates.
    assert ids == ("v/gpu=u1-0", "v/nic=u2-0", "v/nic=u2-0b", "v/nic=u2-1")
    assert lc.cdi_ids_for_container(sidecar, {"gpu": gpu, "shared": shared}, prepared) == ()


def test_unprepare_only_claims_no_active_pod_uses() -> None:
    pod_claims = {"a": frozenset({"c1", "shared"}), "b": frozenset({"c2", "shared"}), "gone": frozenset({"c3"})}
    prepared = {"c1", "c2", "c3", "shared"}
    assert lc.claims_to_unprepare(prepared, pod_claims, ["a", "b"]) == ["c3"]
    assert lc.claims_to_unprepare(prepared, pod_claims, ["b"]) == ["c1", "c3"]
    assert lc.claims_to_unprepare(prepared, pod_claims, []) == ["c1", "c2", "c3", "shared"]


def test_pod_may_go_when_its_claims_are_unprepared_or_shared() -> None:
    pod_claims = {"a": frozenset({"c1", "shared"}), "b": frozenset({"shared"})}
    assert not lc.pod_may_go("a", pod_claims, {"c1", "shared"}, ["b"])  # c1 still prepared for a alone
    assert lc.pod_may_go("a", pod_claims, {"shared"}, ["b"])  # shared is still used by b: fine
    assert not lc.pod_may_go("a", pod_claims, {"shared"}, [])
    assert lc.pod_may_go("unknown", pod_claims, {"c1"}, [])


def test_pending_status_and_condition_merge() -> None:
    scheduled = {"type": "PodScheduled", "status": "True", "lastTransitionTime": "t0"}
    p = pod(conditions=(scheduled,))
    status = lc.pending_status(p, "FailedPrepareDynamicResources", "boom", "t1")
    assert status["phase"] == "Pending"
    conds = {c["type"]: c for c in status["conditions"]}
    assert conds["PodScheduled"] == scheduled  # someone else's condition is kept
    assert conds["PodReadyToStartContainers"]["status"] == "False"
    assert conds["PodReadyToStartContainers"]["reason"] == "FailedPrepareDynamicResources"
    assert [s["state"]["waiting"]["reason"] for s in status["containerStatuses"]] == ["ContainerCreating"] * 2
    # Unchanged status keeps its transition time.
    again = lc.merge_conditions(status["conditions"], [{"type": "PodScheduled", "status": "True",
                                                        "lastTransitionTime": "t9"}])
    assert next(c for c in again if c["type"] == "PodScheduled")["lastTransitionTime"] == "t0"


@pytest.mark.parametrize(
    ("policy", "ok", "phase", "state"),
    [("Always", True, "Running", "running"), ("Never", True, "Succeeded", "terminated"),
     ("OnFailure", True, "Succeeded", "terminated"), ("Always", False, "Failed", "terminated")],
)
def test_started_status(policy: str, ok: bool, phase: str, state: str) -> None:
    p = pod(restart_policy=policy)
    outcomes = [lc.ContainerOutcome("main", ok, 0 if ok else 128, None if ok else "no such CDI device"),
                lc.ContainerOutcome("sidecar", True, 0)]
    health = {"main": (lc.ResourceHealth("claim:gpu", (lc.DeviceHealthEntry("v/gpu=u1-0", "Healthy"),)),)}
    status = lc.started_status(p, outcomes, "t0", "t1", health)
    assert status["phase"] == phase
    main = status["containerStatuses"][0]
    assert state in main["state"]
    if not ok:
        assert main["state"]["terminated"]["reason"] == "StartError"
        assert main["state"]["terminated"]["message"] == "no such CDI device"
    assert main["allocatedResourcesStatus"] == [
        {"name": "claim:gpu", "resources": [{"resourceID": "v/gpu=u1-0", "health": "Healthy"}]}
    ]
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == ("True" if phase == "Running" else "False")


def test_health_entries_resource_ids() -> None:
    """kubelet buildResourceHealth: the first CDI id, else <driver>/<pool>/<device>; the message with the gate."""
    gpu = claim("p-gpu-abc", "u1")
    prepared = {"u1": {"gpu.dev": (PreparedDevice(("gpu",), "pool", "gpu-0", ("v/gpu=u1-0",)),
                                   PreparedDevice(("gpu",), "pool", "gpu-1", ()))}}
    container = lc.ContainerView("main", claims=(lc.ClaimUse("gpu", "gpu"),))

    def health_of(driver: str, pool: str, dev: str) -> tuple[str, str]:
        return ("Unhealthy", "Xid 79") if dev == "gpu-1" else ("Healthy", "")

    entries = lc.health_entries(container, {"gpu": gpu}, prepared, health_of)
    assert entries == (lc.ResourceHealth("claim:gpu/gpu", (lc.DeviceHealthEntry("v/gpu=u1-0", "Healthy"),
                                                           lc.DeviceHealthEntry("gpu.dev/pool/gpu-1", "Unhealthy",
                                                                                "Xid 79"))),)
    assert entries[0].resources[1].to_json() == {"resourceID": "gpu.dev/pool/gpu-1", "health": "Unhealthy",
                                                 "message": "Xid 79"}
    # Without ResourceHealthStatusMessage (before 1.36) there is no message.
    bare = lc.health_entries(container, {"gpu": gpu}, prepared, health_of, with_message=False)
    assert bare[0].resources[1].to_json() == {"resourceID": "gpu.dev/pool/gpu-1", "health": "Unhealthy"}


def test_health_entries_filter_by_request_and_list_a_resource_id_once() -> None:
    gpu = claim("p-gpu-abc", "u1")
    shared = ("v/gpu=shared",)
    prepared = {"u1": {"gpu.dev": (PreparedDevice(("a",), "pool", "gpu-0", shared),
                                   PreparedDevice(("a",), "pool", "gpu-1", shared),
                                   PreparedDevice(("b/sub",), "pool", "gpu-2", ()))}}
    both = lc.ContainerView("main", claims=(lc.ClaimUse("gpu", "a"), lc.ClaimUse("gpu", "b"), lc.ClaimUse("gpu")))
    entries = lc.health_entries(both, {"gpu": gpu}, prepared, lambda d, p, dev: ("Healthy", ""))
    assert [(e.name, [r.resource_id for r in e.resources]) for e in entries] == [
        ("claim:gpu/a", ["v/gpu=shared"]),
        ("claim:gpu/b", ["gpu.dev/pool/gpu-2"]),
        ("claim:gpu", ["v/gpu=shared", "gpu.dev/pool/gpu-2"]),
    ]
