"""Every `resource.Quantity` field of a built-in kind in its canonical form, as a real API server stores it.

kube-apiserver decodes each Quantity (apimachinery `pkg/api/resource/quantity.go`: `UnmarshalJSON` ->
`ParseQuantity`, which keeps the text only when it already is canonical) and encodes it again with `String()`, so
`2048Mi` comes back as `2Gi`, `1000m` as `1`, `0.5` as `500m` and a JSON number `1000` as `1k`. Which fields are
Quantities comes from the kind's OpenAPI schema (`openapi.definitions`, Kubernetes' own): pod container
requests/limits and overhead, node capacity/allocatable, ResourceSlice capacity values, counters and request
policies, ResourceClaim capacity requests and consumed capacity, and the rest. The canonical text is the product's
Quantity (`dra_driver/k8s/quantity.py`, held against apimachinery's `quantity_test.go`). A value that does not parse
is left for validation to refuse.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dra_driver.k8s.quantity import QuantityError, parse_quantity

from .openapi import closure, definition_name, definitions

QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"


@dataclass(eq=False)
class _Shape:
    """Where Quantities sit below one schema node: named fields, list items, map values, or here."""

    quantity: bool = False
    fields: dict[str, _Shape] = field(default_factory=dict)
    items: _Shape | None = None
    values: _Shape | None = None


def _ref(node: Mapping[str, Any]) -> str | None:
    ref = node.get("$ref")
    if isinstance(ref, str):
        return ref.rsplit("/", 1)[-1]
    for key in ("allOf", "anyOf", "oneOf"):
        for sub in node.get(key) or ():
            if isinstance(sub, Mapping) and (found := _ref(sub)) is not None:
                return found
    return None


class _Builder:
    def __init__(self, defs: Mapping[str, Any]) -> None:
        self._defs = defs
        self._named: dict[str, _Shape] = {}  # filled before its fields: recursive schemas refer to themselves

    def named(self, name: str) -> _Shape:
        if name in self._named:
            return self._named[name]
        shape = _Shape(quantity=name == QUANTITY)
        self._named[name] = shape
        if not shape.quantity:
            self._fill(shape, self._defs.get(name) or {})
        return shape

    def node(self, schema: Mapping[str, Any]) -> _Shape:
        name = _ref(schema)
        if name is not None:
            return self.named(name)
        shape = _Shape()
        self._fill(shape, schema)
        return shape

    def _fill(self, shape: _Shape, schema: Mapping[str, Any]) -> None:
        for key, sub in (schema.get("properties") or {}).items():
            if isinstance(sub, Mapping):
                shape.fields[key] = self.node(sub)
        if isinstance(schema.get("items"), Mapping):
            shape.items = self.node(schema["items"])
        if isinstance(schema.get("additionalProperties"), Mapping):
            shape.values = self.node(schema["additionalProperties"])


@functools.lru_cache(maxsize=256)
def _shape_of(kube_version: str, group: str, version: str, kind: str) -> _Shape | None:
    """The kind's Quantity shape, or None when it has no Quantity at all (nothing to walk)."""
    defs = definitions(kube_version)
    name = definition_name(defs, group, version, kind)
    if name is None or QUANTITY not in closure(defs, [name]):
        return None
    return _Builder(defs).named(name)


def _canonical(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        return value
    try:
        return str(parse_quantity(str(value)))
    except (QuantityError, ValueError):
        return value


def _walk(value: Any, shape: _Shape) -> Any:
    if shape.quantity:
        return _canonical(value)
    if isinstance(value, dict):
        for key, sub in value.items():
            inner = shape.fields.get(key) or shape.values
            if inner is not None:
                value[key] = _walk(sub, inner)
    elif isinstance(value, list) and shape.items is not None:
        for i, item in enumerate(value):
            value[i] = _walk(item, shape.items)
    return value


def canonicalize(obj: dict[str, Any], kube_version: str, group: str, version: str, kind: str) -> None:
    """Rewrite, in place, every Quantity of `obj` (a built-in kind in `group/version`) to its canonical text."""
    shape = _shape_of(kube_version, group, version, kind)
    if shape is not None:
        _walk(obj, shape)
