"""Static CEL types for the checker (pure): enough of cel-go's type system to resolve overloads and to report
the compile errors Kubernetes reports ("found no matching overload ...", "undefined field ...")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

__all__ = [
    "ANY",
    "BOOL",
    "BYTES",
    "CIDR",
    "DEVICE",
    "DOUBLE",
    "DURATION",
    "DYN",
    "FORMAT",
    "INT",
    "IP",
    "NULL",
    "QUANTITY",
    "SEMVER",
    "STRING",
    "TIMESTAMP",
    "TYPE",
    "UINT",
    "URL",
    "CelType",
    "assignable",
    "list_of",
    "map_of",
    "optional_of",
    "param",
]


@dataclass(frozen=True)
class CelType:
    name: str
    params: tuple[CelType, ...] = ()
    is_param: bool = False  # a type parameter (A, B) of a generic overload

    def __str__(self) -> str:
        if not self.params:
            return self.name
        return f"{self.name}({', '.join(str(p) for p in self.params)})"

    @property
    def is_dyn(self) -> bool:
        return self.name in ("dyn", "google.protobuf.Any") or self.is_param


DYN: Final = CelType("dyn")
ANY: Final = CelType("google.protobuf.Any")  # the DRA attribute type (1.34-1.35): behaves as dyn
INT: Final = CelType("int")
UINT: Final = CelType("uint")
DOUBLE: Final = CelType("double")
BOOL: Final = CelType("bool")
STRING: Final = CelType("string")
BYTES: Final = CelType("bytes")
NULL: Final = CelType("null_type")
TYPE: Final = CelType("type")
DURATION: Final = CelType("google.protobuf.Duration")
TIMESTAMP: Final = CelType("google.protobuf.Timestamp")
QUANTITY: Final = CelType("kubernetes.Quantity")
SEMVER: Final = CelType("kubernetes.Semver")
DEVICE: Final = CelType("kubernetes.DRADevice")
URL: Final = CelType("kubernetes.URL")
IP: Final = CelType("net.IP")
CIDR: Final = CelType("net.CIDR")
FORMAT: Final = CelType("kubernetes.NamedFormat")


def list_of(elem: CelType) -> CelType:
    return CelType("list", (elem,))


def map_of(key: CelType, value: CelType) -> CelType:
    return CelType("map", (key, value))


def optional_of(elem: CelType) -> CelType:
    return CelType("optional_type", (elem,))


def param(name: str) -> CelType:
    return CelType(name, is_param=True)


def assignable(param_type: CelType, arg: CelType, bindings: dict[str, CelType]) -> bool:
    """Whether an argument of static type `arg` may be passed for `param_type` (dyn goes both ways)."""
    if param_type.is_param:
        bound = bindings.get(param_type.name)
        if bound is None or bound.is_dyn:
            bindings[param_type.name] = arg
            return True
        return arg.is_dyn or assignable(bound, arg, bindings)
    if param_type.is_dyn or arg.is_dyn:
        return True
    if param_type.name != arg.name:
        # null is assignable to nothing but null, dyn and optional wrappers in cel-go; keep it strict
        return False
    if len(param_type.params) != len(arg.params):
        return not param_type.params or not arg.params
    return all(assignable(p, a, bindings) for p, a in zip(param_type.params, arg.params, strict=True))


def substitute(t: CelType, bindings: dict[str, CelType]) -> CelType:
    if t.is_param:
        return bindings.get(t.name, DYN)
    if not t.params:
        return t
    return CelType(t.name, tuple(substitute(p, bindings) for p in t.params))
