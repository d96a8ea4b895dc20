"""`dra-driver status`'s pure part, on hand-made API objects."""

from __future__ import annotations

from typing import Any

from dra_driver.commands.statusview import build_status, readable_claims, render

D = "gpu.dra.dev"


def _device(name: str, type_: str, uuid: str, **extra: Any) -> dict[str, Any]:
    attrs = {"type": {"string": type_}, "productName": {"string": "NVIDIA L4"}, "minor": {"int": 0}}
    attrs["parentUUID" if type_ == "mig" else "uuid"] = {"string": uuid}
    return {"name": name, "attributes": attrs, **extra}


def _slice(node: str, generation: int, devices: list[dict[str, Any]]) -> dict[str, Any]:
    pool = {"name": node, "generation": generation, "resourceSliceCount": 1}
    return {"spec": {"driver": D, "nodeName": node, "pool": pool, "devices": devices}}


def test_shares_strategies_and_only_the_newest_generation() -> None:
    taint = {"key": f"{D}/ecc", "value": "double-bit", "effect": "NoSchedule"}
    slices = [
        _slice("n1", 1, [_device("gpu-0", "gpu", "GPU-A", taints=[taint])]),  # the old generation
        _slice("n1", 2, [_device("gpu-0", "gpu", "GPU-A"), _device("gpu-0-shared", "gpu-share", "GPU-A")]),
        {"spec": {"driver": "other.dev", "nodeName": "n1", "pool": {"name": "n1", "generation": 9}, "devices": []}},
    ]
    config = {"source": "FromClaim", "opaque": {"driver": D, "parameters": {"sharing": {"strategy": "MPS"}}}, "requests": []}
    def claim(i: int) -> dict[str, Any]:
        result = {"driver": D, "pool": "n1", "device": "gpu-0-shared", "request": "r0", "shareID": f"s{i}"}
        return {
            "metadata": {"namespace": "ml", "name": f"c{i}"},
            "status": {
                "allocation": {"devices": {"results": [result], "config": [config]}},
                "reservedFor": [{"resource": "pods", "name": f"p{i}", "uid": "u"}],
            },
        }

    claims, problems = readable_claims([claim(1), claim(2), {"metadata": {"name": "bad"}, "status": {"reservedFor": 1}}])
    assert problems == ["ResourceClaim bad: status.reservedFor: must be a list, got int"]
    pods = [{"metadata": {"namespace": "ml", "name": "p1"}, "status": {"phase": "Running"}}]
    [node] = build_status(slices, claims, pods, driver=D)
    [gpu] = node.gpus
    assert (gpu.name, gpu.health, gpu.sharing, gpu.taints) == ("gpu-0", "Healthy", "shares", ())
    assert [(h.claim, h.pods, h.share, h.sharing) for h in gpu.holders] == [
        ("ml/c1", ("ml/p1 (Running)",), "s1", "MPS"),
        ("ml/c2", ("ml/p2",), "s2", "MPS"),
    ]
    table = render([node], "", driver=D)
    assert "ml/c1 [share s1, MPS] <- ml/p1 (Running); ml/c2 [share s2, MPS] <- ml/p2" in table
    assert build_status(slices, claims, pods, driver=D, nodes=["n2"]) == []
    assert "gpu-0-shared" in render([node], "yaml", driver=D)


def test_a_gpu_in_mig_mode_and_a_tainted_mig_device() -> None:
    taint = {"key": f"{D}/xid", "value": "94", "effect": "NoSchedule"}
    slices = [_slice("n1", 1, [_device("gpu-0-mig-1g", "mig", "GPU-A", taints=[taint]),
                               _device("gpu-0-mig-2g", "mig", "GPU-A")])]  # fmt: skip
    [node] = build_status(slices, [], [], driver=D)
    [gpu] = node.gpus
    assert (gpu.name, gpu.sharing, gpu.mig_devices, gpu.mig_allocated) == ("gpu-0", "mig", 2, 0)
    assert [(m.name, m.health, m.taints) for m in gpu.mig] == [
        ("gpu-0-mig-1g", "Unhealthy", (f"{D}/xid=94:NoSchedule",))
    ]
    assert "xid=94:NoSchedule" in render([node], "wide", driver=D)


def test_what_the_plugin_reported_in_the_claims_status_devices() -> None:
    slices = [_slice("n1", 1, [_device("gpu-0-mig-1g", "mig", "GPU-A")])]
    ready = {"type": "Ready", "status": "True", "reason": "Prepared", "lastTransitionTime": "t"}
    failed = {"type": "Ready", "status": "False", "reason": "PrepareFailed", "message": "no such device",
              "lastTransitionTime": "t"}
    claims = [
        {"metadata": {"namespace": "ml", "name": "a"}, "status": {"devices": [
            {"driver": D, "pool": "n1", "device": "gpu-0-mig-1g", "conditions": [ready],
             "data": {"uuid": "MIG-1", "parentUUID": "GPU-A", "migProfile": "1g.10gb"}},
            {"driver": "other.dev", "pool": "n1", "device": "nic-0"}]}},
        {"metadata": {"namespace": "ml", "name": "b"}, "status": {"devices": [
            {"driver": D, "pool": "n1", "device": "gpu-9", "conditions": [failed]}]}},
    ]  # fmt: skip
    parsed, problems = readable_claims(claims)
    assert problems == []
    [node] = build_status(slices, parsed, [], driver=D)
    assert [(d.claim, d.device, d.uuid, d.profile, d.ready) for d in node.claim_devices] == [
        ("ml/a", "gpu-0-mig-1g", "MIG-1", "1g.10gb", "True"), ("ml/b", "gpu-9", "", "", "False")]
    table = render([node], "", driver=D)
    lines = table.split("CLAIM DEVICE STATUS (status.devices)\n", 1)[1].splitlines()
    assert lines[0].split() == ["NODE", "CLAIM", "DEVICE", "UUID", "PROFILE", "READY"]
    assert lines[1].split() == ["n1", "ml/a", "gpu-0-mig-1g", "MIG-1", "1g.10gb", "True"]
    assert lines[2].split() == ["n1", "ml/b", "gpu-9", "-", "-", "False", "(PrepareFailed)"]
    assert "(no such device)" in render([node], "wide", driver=D)
    assert '"uuid": "MIG-1"' in render([node], "json", driver=D)
    assert "CLAIM DEVICE STATUS" not in render(build_status(slices, [], [], driver=D), "", driver=D)


def test_a_node_whose_driver_is_not_ready_says_so_with_or_without_slices() -> None:
    """The plugin's Node annotation gpu.dra.dev/nvidia-driver (nvidiadriver/state.py): a node that never published
    (driver absent since start) is listed anyway; one with slices keeps them and says its driver is reloading."""
    reason = "libnvidia-ml.so.1 not found under the driver root /driver-root (--driver-root). Fix: set driverRoot"
    states = {"n1": "reloading: every GPU answers GPU_IS_LOST", "n2": f"not-ready: {reason}", "n3": "ready"}
    slices = [_slice("n1", 1, [_device("gpu-0", "gpu", "GPU-A")]), _slice("n3", 1, [_device("gpu-0", "gpu", "GPU-C")])]
    nodes = build_status(slices, [], [], driver=D, driver_states=states)
    assert [(n.name, len(n.gpus), n.driver) for n in nodes] == [
        ("n1", 1, "driver reloading: every GPU answers GPU_IS_LOST"),
        ("n2", 0, f"driver not ready: {reason}"),
        ("n3", 1, "ready"),
    ]
    table = render(nodes, "", driver=D)
    assert "n2    (driver not ready)" in table
    section = table.split("NVIDIA DRIVER NOT READY", 1)[1]
    assert f"n2    driver not ready: {reason}" in section and "driver reloading: every GPU" in section
    assert "n3" not in section
    assert build_status(slices, [], [], driver=D, nodes=["n3"], driver_states=states)[0].driver == "ready"
    assert [n.name for n in build_status(slices, [], [], driver=D, nodes=["n3"], driver_states=states)] == ["n3"]
    assert '"driver": "driver not ready: ' in render(nodes, "json", driver=D)
