"""Node selector matching (core/v1 NodeSelector semantics) and slice/device node targeting."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from dra_driver.allocation.model import Node, NodeTarget

_INT64 = re.compile(r"[+-]?[0-9]+")
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def _int64(text: str) -> int | None:
    """strconv.ParseInt(text, 10, 64): an optional sign and decimal digits only (no spaces, no '_')."""
    if not _INT64.fullmatch(text):
        return None
    number = int(text)
    return number if INT64_MIN <= number <= INT64_MAX else None


def _requirement_matches(req: Mapping[str, Any], value: str | None, *, field: bool) -> bool:
    """One requirement, as k8s.io/component-helpers scheduling/corev1/nodeaffinity parses and matches it: a
    requirement that does not parse (In/NotIn without values, Exists/DoesNotExist with values, Gt/Lt without
    exactly one integer, a field requirement other than In/NotIn with exactly one value, an unknown operator)
    makes its whole term match nothing."""
    operator = req.get("operator")
    values: Sequence[str] = [str(v) for v in req.get("values") or ()]
    if field and (operator not in ("In", "NotIn") or len(values) != 1):
        return False
    if operator in ("In", "NotIn"):
        if not values:
            return False
        return (value is not None and value in values) if operator == "In" else (value is None or value not in values)
    if operator in ("Exists", "DoesNotExist"):
        if values:
            return False
        return (value is not None) if operator == "Exists" else (value is None)
    if operator in ("Gt", "Lt"):
        want = _int64(values[0]) if len(values) == 1 else None
        have = _int64(value) if value is not None else None
        # A label that is not an integer simply does not match, as in labels.Requirement.Matches.
        if want is None or have is None:
            return False
        return have > want if operator == "Gt" else have < want
    return False


def _term_matches(term: Mapping[str, Any], node: Node) -> bool:
    expressions = term.get("matchExpressions") or ()
    fields = term.get("matchFields") or ()
    if not expressions and not fields:
        return False  # an empty term matches no node
    for req in expressions:
        if not _requirement_matches(req, node.labels.get(str(req.get("key"))), field=False):
            return False
    for req in fields:
        # metadata.name is the only field Kubernetes supports in node selector terms.
        value = node.name if req.get("key") == "metadata.name" else None
        if req.get("key") != "metadata.name" or not _requirement_matches(req, value, field=True):
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
