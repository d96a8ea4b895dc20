"""Builders for resource.k8s.io/v1 objects as plain JSON dicts, exactly as the API server returns them."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from dra_driver.allocation import AllocationOutcome, allocate
from dra_driver.defaults import DRIVER_NAME

NODE = "node-1"


class Version(str):
    """Marks an attribute value as a semver `version` attribute."""


def attr(value: Any) -> dict[str, Any]:
    if isinstance(value, Version):
        return {"version": str(value)}
    if isinstance(value, bool):
        return {"bool": value}
    if isinstance(value, int):
        return {"int": value}
    return {"string": value}


def device(
    name: str,
    attrs: Mapping[str, Any] | None = None,
    capacity: Mapping[str, Any] | None = None,
    *,
    consumes: Iterable[tuple[str, Mapping[str, str]]] = (),
    taints: Iterable[Mapping[str, str]] = (),
    multi: bool | None = None,
    **extra: Any,
) -> dict[str, Any]:
    dev: dict[str, Any] = {"name": name}
    if attrs:
        dev["attributes"] = {k: attr(v) for k, v in attrs.items()}
    if capacity:
        dev["capacity"] = {k: (v if isinstance(v, dict) else {"value": v}) for k, v in capacity.items()}
    consumed = [{"counterSet": s, "counters": {k: {"value": v} for k, v in c.items()}} for s, c in consumes]
    if consumed:
        dev["consumesCounters"] = consumed
    if taints:
        dev["taints"] = [dict(t) for t in taints]
    if multi is not None:
        dev["allowMultipleAllocations"] = multi
    dev.update(extra)
    return dev


def resource_slice(
    name: str,
    devices: Iterable[Mapping[str, Any]] = (),
    *,
    pool: str = "pool-1",
    node: str | None = NODE,
    generation: int = 1,
    count: int = 1,
    driver: str = DRIVER_NAME,
    node_selector: Mapping[str, Any] | None = None,
    all_nodes: bool = False,
    per_device: bool = False,
    counter_sets: Mapping[str, Mapping[str, str]] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "driver": driver,
        "pool": {"name": pool, "generation": generation, "resourceSliceCount": count},
    }
    if per_device:
        spec["perDeviceNodeSelection"] = True
    elif node_selector is not None:
        spec["nodeSelector"] = node_selector
    elif all_nodes:
        spec["allNodes"] = True
    else:
        spec["nodeName"] = node
    devs = list(devices)
    if devs:
        spec["devices"] = devs
    if counter_sets:
        spec["sharedCounters"] = [
            {"name": n, "counters": {k: {"value": v} for k, v in c.items()}} for n, c in counter_sets.items()
        ]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name}, "spec": spec}


def device_class(
    name: str = DRIVER_NAME, selectors: Iterable[str] = (), config: Iterable[Mapping[str, Any]] = ()
) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    sels = [{"cel": {"expression": e}} for e in selectors]
    if sels:
        spec["selectors"] = sels
    cfg = [{"opaque": dict(c)} for c in config]
    if cfg:
        spec["config"] = cfg
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name}, "spec": spec}


GPU_CLASS = device_class(DRIVER_NAME, [f'device.driver == "{DRIVER_NAME}"'])


def exact(
    name: str,
    cls: str = DRIVER_NAME,
    *,
    count: int | None = None,
    mode: str | None = None,
    selectors: Iterable[str] = (),
    admin: bool | None = None,
    tolerations: Iterable[Mapping[str, Any]] = (),
    capacity: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    body = sub(name, cls, count=count, mode=mode, selectors=selectors, tolerations=tolerations, capacity=capacity)
    body.pop("name")
    if admin is not None:
        body["adminAccess"] = admin
    return {"name": name, "exactly": body}


def sub(
    name: str,
    cls: str = DRIVER_NAME,
    *,
    count: int | None = None,
    mode: str | None = None,
    selectors: Iterable[str] = (),
    tolerations: Iterable[Mapping[str, Any]] = (),
    capacity: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {"name": name, "deviceClassName": cls}
    if count is not None:
        body["count"] = count
    if mode is not None:
        body["allocationMode"] = mode
    sels = [{"cel": {"expression": e}} for e in selectors]
    if sels:
        body["selectors"] = sels
    tols = [dict(t) for t in tolerations]
    if tols:
        body["tolerations"] = tols
    if capacity:
        body["capacity"] = {"requests": dict(capacity)}
    return body


def first_available(name: str, subs: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    return {"name": name, "firstAvailable": [dict(s) for s in subs]}


def claim(
    requests: Iterable[Mapping[str, Any]],
    *,
    name: str = "claim-1",
    namespace: str = "default",
    constraints: Iterable[Mapping[str, Any]] = (),
    config: Iterable[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": [dict(r) for r in requests]}
    cons = [dict(c) for c in constraints]
    if cons:
        devices["constraints"] = cons
    cfg = [dict(c) for c in config]
    if cfg:
        devices["config"] = cfg
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"},
        "spec": {"devices": devices},
    }


def allocated(name: str, results: Iterable[Mapping[str, Any]], *, namespace: str = "default") -> dict[str, Any]:
    obj = claim([exact("r")], name=name, namespace=namespace)
    obj["status"] = {"allocation": {"devices": {"results": [dict(r) for r in results]}}}
    return obj


def result(dev: str, *, pool: str = "pool-1", request: str = "r", **extra: Any) -> dict[str, Any]:
    return {"request": request, "driver": DRIVER_NAME, "pool": pool, "device": dev, **extra}


def node(name: str = NODE, labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": dict(labels or {})}}


def share_ids() -> Callable[[], str]:
    counter = itertools.count(1)
    return lambda: f"share-{next(counter)}"


def run(
    claim_obj: Mapping[str, Any],
    slices: Iterable[Mapping[str, Any]],
    *,
    classes: Iterable[Mapping[str, Any]] = (GPU_CLASS,),
    allocated_claims: Iterable[Mapping[str, Any]] = (),
    node_obj: Mapping[str, Any] | None = None,
    namespace_labels: Mapping[str, str] | None = None,
    gates: Mapping[str, bool] | None = None,
    **kwargs: Any,
) -> AllocationOutcome:
    return allocate(
        claim_obj,
        node=node_obj or node(),
        classes=list(classes),
        slices=list(slices),
        allocated_claims=list(allocated_claims),
        namespace_labels=namespace_labels or {},
        feature_gates=gates,
        new_share_id=share_ids(),
        **kwargs,
    )


def devices_of(outcome: AllocationOutcome) -> list[tuple[str, str]]:
    """(request, device) pairs of a successful outcome."""
    assert outcome.allocation is not None, outcome.explanation
    return [(r["request"], r["device"]) for r in outcome.allocation["devices"]["results"]]


def reasons(outcome: AllocationOutcome, request: str | None = None) -> dict[str, int]:
    assert outcome.explanation is not None
    out: dict[str, int] = {}
    for req in outcome.explanation.requests:
        if request is None or req.request == request:
            for reason in req.reasons:
                out[reason.reason] = out.get(reason.reason, 0) + reason.count
    return out
