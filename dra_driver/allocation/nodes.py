"""Node selector matching (core/v1 NodeSelector semantics) and slice/device node targeting."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dra_driver.allocation.model import Node, NodeTarget


def _requirement_matches(req: Mapping[str, Any], value: str | None) -> bool:
    operator = req.get("operator")
    values: Sequence[str] = req.get("values") or ()
    if operator == "In":
        return value is not None and value in values
    if operator == "NotIn":
        return value is None or value not in values
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    if operator in ("Gt", "Lt"):
        # Both sides must be integers; anything else simply does not match, as in Kubernetes.
        try:
            have, want = int(value or ""), int(values[0])
        except (ValueError, IndexError):
            return False
        return have > want if operator == "Gt" else have < want
    return False


def _term_matches(term: Mapping[str, Any], node: Node) -> bool:
    expressions = term.get("matchExpressions") or ()
    fields = term.get("matchFields") or ()
    if not expressions and not fields:
        return False  # an empty term matches no node
    for req in expressions:
        if not _requirement_matches(req, node.labels.get(str(req.get("key")))):
            return False
    for req in fields:
        # metadata.name is the only field Kubernetes supports in node selector terms.
        value = node.name if req.get("key") == "metadata.name" else None
        if not _requirement_matches(req, value):
            return False
    return True


def node_selector_matches(selector: Mapping[str, Any], node: Node) -> bool:
    """Terms are ORed; inside a term every requirement must hold."""
    return any(_term_matches(term, node) for term in selector.get("nodeSelectorTerms") or ())


def target_matches(target: NodeTarget, node: Node) -> bool:
    if target.node_name is not None:
        return target.node_name == node.name
    if target.node_selector is not None:
        return node_selector_matches(target.node_selector, node)
    return target.all_nodes
