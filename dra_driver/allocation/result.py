"""Build the status.allocation object (resource.k8s.io/v1 AllocationResult) from the chosen devices."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dra_driver.allocation.context import AllocationContext
from dra_driver.allocation.model import NodeTarget
from dra_driver.allocation.search import Pick


def _results(ctx: AllocationContext, picks: Sequence[Pick], new_share_id: Callable[[], str]) -> list[dict[str, Any]]:
    results = []
    for pick in picks:
        entry: dict[str, Any] = {
            "request": pick.request_name,
            "driver": pick.cand.id.driver,
            "pool": pick.cand.id.pool,
            "device": pick.cand.id.device,
        }
        if pick.alt.admin_access:
            entry["adminAccess"] = True
        if pick.alt.tolerations:
            entry["tolerations"] = [dict(t.raw) for t in pick.alt.tolerations]
        device = pick.cand.device
        if ctx.gates.binding_conditions and device.binding_conditions:
            entry["bindingConditions"] = list(device.binding_conditions)
            entry["bindingFailureConditions"] = list(device.binding_failure_conditions)
        if pick.share:
            entry["shareID"] = new_share_id()
            if pick.consumed:
                entry["consumedCapacity"] = {name: str(q) for name, q in pick.consumed.items()}
        results.append(entry)
    return results


def _config(ctx: AllocationContext, picks: Sequence[Pick]) -> list[dict[str, Any]]:
    """Class configs first (each class once, listing the requests that use it), then claim configs
    for the allocated requests; a config that covers every request drops its `requests` list."""
    chosen: dict[str, Pick] = {}
    for pick in picks:
        chosen.setdefault(pick.request.name, pick)
    names = [chosen[r.name].request_name for r in ctx.claim.requests if r.name in chosen]
    configs: list[dict[str, Any]] = []
    class_entries: dict[str, list[dict[str, Any]]] = {}
    for request in ctx.claim.requests:
        if request.name not in chosen:  # pragma: no cover - a successful search serves every request
            continue
        pick = chosen[request.name]
        class_name = pick.alt.class_name
        if class_name in class_entries:
            for entry in class_entries[class_name]:
                entry["requests"].append(pick.request_name)
            continue
        entries = []
        for config in ctx.classes[class_name].config:
            entry = {"source": "FromClass", "requests": [pick.request_name]}
            entry.update({k: v for k, v in config.items() if k not in ("source", "requests")})
            entries.append(entry)
        class_entries[class_name] = entries
        configs.extend(entries)
    for claim_config in ctx.claim.config:
        requested = list(claim_config.requests)
        body = {k: v for k, v in claim_config.raw.items() if k != "requests"}
        if requested and not any(
            r.name in requested or chosen[r.name].request_name in requested
            for r in ctx.claim.requests
            if r.name in chosen
        ):
            continue
        entry = {"source": "FromClaim", **({"requests": requested} if requested else {}), **body}
        configs.append(entry)
    for entry in configs:
        listed = entry.get("requests")
        if listed and all(name in listed or name.split("/", 1)[0] in listed for name in names):
            del entry["requests"]
    return configs


def _node_selector(ctx: AllocationContext, picks: Sequence[Pick]) -> dict[str, Any] | None:
    fields: list[Any] = []
    expressions: list[Any] = []
    for pick in picks:
        target: NodeTarget | None = (
            pick.cand.device.target if pick.cand.slice.per_device_node_selection else pick.cand.slice.target
        )
        if target is None:  # pragma: no cover - per-device slices always carry a target
            continue
        if target.node_name is not None or pick.cand.device.binds_to_node:
            return {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [ctx.node.name]}]}
                ]
            }
        if target.node_selector is not None:
            terms = target.node_selector.get("nodeSelectorTerms") or []
            if len(terms) == 1:
                term: Mapping[str, Any] = terms[0]
                for req in term.get("matchFields") or []:
                    if req not in fields:
                        fields.append(req)
                for req in term.get("matchExpressions") or []:
                    if req not in expressions:
                        expressions.append(req)
    if not fields and not expressions:
        return None  # usable on every node
    term_out: dict[str, Any] = {}
    if expressions:
        term_out["matchExpressions"] = expressions
    if fields:
        term_out["matchFields"] = fields
    return {"nodeSelectorTerms": [term_out]}


def build_allocation(ctx: AllocationContext, picks: Sequence[Pick], new_share_id: Callable[[], str]) -> dict[str, Any]:
    devices: dict[str, Any] = {"results": _results(ctx, picks, new_share_id)}
    config = _config(ctx, picks)
    if config:
        devices["config"] = config
    allocation: dict[str, Any] = {"devices": devices}
    selector = _node_selector(ctx, picks)
    if selector is not None:
        allocation["nodeSelector"] = selector
    return allocation
