"""The control plane's count of the driver's pools (KEP-5677 `ResourcePoolStatusRequest`), as `dra-driver status
--pool-status` shows it. Pure: the request's status in, rows and text out.

kube-controller-manager fills `status` once (resource.k8s.io/v1alpha3, gate DRAResourcePoolStatus): `poolCount`, the
first `spec.limit` pools (`driver`, `poolName`, `nodeName`, `generation`, `resourceSliceCount`, `totalDevices`,
`allocatedDevices`, `availableDevices`, `unavailableDevices`, `validationError`) and a `Complete` or `Failed`
condition (docs/reference/dra-in-flight.md, KEP-5677). Every count is optional in the API: a missing one shows "-".
Where the slices name a partition type attribute (gate DRAPartitionableDevicesType, 1.37) a pool also has
`partitionSummary` (`attribute`, `type`, `total`, `allocatable`: how many devices of that type still fit the counters).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

JsonObject = dict[str, Any]
COMPLETE, FAILED = "Complete", "Failed"
COUNTS = ("resourceSliceCount", "totalDevices", "allocatedDevices", "availableDevices", "unavailableDevices")


@dataclass(frozen=True)
class PartitionTypeSummary:
    attribute: str
    type: str
    total: int | None
    allocatable: int | None


@dataclass(frozen=True)
class PoolSummary:
    pool: str
    node: str  # "" when the pool is not a node's
    generation: int | None
    slices: int | None
    devices: int | None
    allocated: int | None
    available: int | None
    unavailable: int | None
    problem: str  # the controller's validationError, "" when none
    partitions: tuple[PartitionTypeSummary, ...] = ()  # partitionSummary, in the controller's order


@dataclass(frozen=True)
class PoolReport:
    pools: tuple[PoolSummary, ...]
    pool_count: int | None  # how many pools matched (more than `pools` when the answer was cut at spec.limit)
    failed: str  # the Failed condition's message, "" when the request completed


def finished(request: Mapping[str, Any] | None) -> bool:
    """Whether kube-controller-manager has answered: a status with a Complete or Failed condition that is True."""
    status = (request or {}).get("status")
    if not isinstance(status, dict):
        return False
    return any(isinstance(c, dict) and c.get("type") in (COMPLETE, FAILED) and c.get("status") == "True"
               for c in status.get("conditions") or [])


def _int(value: Any) -> int | None:
    return value if type(value) is int else None


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _partitions(raw: Any) -> tuple[PartitionTypeSummary, ...]:
    return tuple(PartitionTypeSummary(attribute=_text(p.get("attribute")), type=_text(p.get("type")),
                                      total=_int(p.get("total")), allocatable=_int(p.get("allocatable")))
                 for p in (raw if isinstance(raw, list) else []) if isinstance(p, dict))


def parse_report(request: Mapping[str, Any], driver: str) -> PoolReport:
    """The driver's pools in a finished request (other drivers' entries are ignored; untrusted values are dropped)."""
    status = request.get("status") if isinstance(request.get("status"), dict) else {}
    assert isinstance(status, dict)
    failed = next((_text(c.get("message")) or _text(c.get("reason")) or FAILED
                   for c in status.get("conditions") or []
                   if isinstance(c, dict) and c.get("type") == FAILED and c.get("status") == "True"), "")
    pools = []
    for raw in status.get("pools") or []:
        if not isinstance(raw, dict) or raw.get("driver") not in (None, driver):
            continue
        slices, devices, allocated, available, unavailable = (_int(raw.get(k)) for k in COUNTS)
        pools.append(PoolSummary(pool=_text(raw.get("poolName")), node=_text(raw.get("nodeName")),
                                 generation=_int(raw.get("generation")), slices=slices, devices=devices,
                                 allocated=allocated, available=available, unavailable=unavailable,
                                 problem=_text(raw.get("validationError")),
                                 partitions=_partitions(raw.get("partitionSummary"))))
    return PoolReport(tuple(sorted(pools, key=lambda p: (p.node, p.pool))), _int(status.get("poolCount")), failed)


def only_nodes(report: PoolReport, nodes: Sequence[str]) -> PoolReport:
    """The pools of these nodes (all when none are named); a pool is a node's by `nodeName`, else by its name."""
    if not nodes:
        return report
    wanted = set(nodes)
    return PoolReport(tuple(p for p in report.pools if (p.node or p.pool) in wanted), report.pool_count, report.failed)


def _cell(value: int | None) -> str:
    return "-" if value is None else str(value)


def render_pool_table(report: PoolReport) -> str:
    title = "POOL STATUS (ResourcePoolStatusRequest, counted by kube-controller-manager)"
    if report.failed:
        return f"{title}\nthe request failed: {report.failed}"
    rows = [["NODE", "POOL", "GENERATION", "SLICES", "DEVICES", "ALLOCATED", "AVAILABLE", "UNAVAILABLE", "PROBLEM"]]
    for p in report.pools:
        rows.append([p.node or "-", p.pool, _cell(p.generation), _cell(p.slices), _cell(p.devices),
                     _cell(p.allocated), _cell(p.available), _cell(p.unavailable), p.problem])
    if len(rows) == 1:
        return f"{title}\n(no pools of this driver)"
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    text = "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)
    shown = len(report.pools)
    if report.pool_count is not None and report.pool_count > shown:
        text += f"\n(the controller counted {report.pool_count} pools; this shows {shown})"
    return f"{title}\n{text}" + _partition_table(report)


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def _partition_table(report: PoolReport) -> str:
    """The pools' partitionSummary entries, one row each; "" when no pool has any."""
    rows = [["NODE", "POOL", "PARTITION TYPE", "TOTAL", "ALLOCATABLE", "ATTRIBUTE"]]
    for p in report.pools:
        rows += [[p.node or "-", p.pool, t.type, _cell(t.total), _cell(t.allocatable), t.attribute]
                 for t in p.partitions]
    if len(rows) == 1:
        return ""
    return "\n\nPARTITION TYPES (partitionSummary: devices of each type that still fit the shared counters)\n" + (
        _table(rows))


def pool_data(pool: PoolSummary) -> JsonObject:
    """One pool as `-o json|yaml` shows it under the node's `poolStatus` key (the API's own field names)."""
    return {"poolName": pool.pool, "generation": pool.generation, "resourceSliceCount": pool.slices,
            "totalDevices": pool.devices, "allocatedDevices": pool.allocated, "availableDevices": pool.available,
            "unavailableDevices": pool.unavailable, "validationError": pool.problem or None,
            "partitionSummary": [{"attribute": t.attribute, "type": t.type, "total": t.total,
                                  "allocatable": t.allocatable} for t in pool.partitions] or None}
