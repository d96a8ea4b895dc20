"""CEL values at run time and the rules every function shares: types, equality, ordering, errors (pure).

CEL values are plain Python values where they can be, for speed: int (CEL int), UInt (CEL uint), float
(double), bool, str, bytes, None (null), list/tuple (list), dict (map), plus Quantity, Semver, Optional,
CelTypeValue and the network/URL values of the Kubernetes libraries. Python's bool is an int, so every
rule below tests bool first.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import UnionType
from typing import Any, Final, cast

from dra_driver.cel.syntax import UInt
from dra_driver.k8s.quantity import Quantity
from dra_driver.k8s.semver import Semver

__all__ = [
    "INT_MAX",
    "INT_MIN",
    "UINT_MAX",
    "CelEvalError",
    "CelTypeValue",
    "Optional",
    "cel_compare",
    "cel_equal",
    "check_int",
    "go_type_name",
    "no_such_overload",
    "type_name",
]

INT_MAX: Final = 2**63 - 1
INT_MIN: Final = -(2**63)
UINT_MAX: Final = 2**64 - 1


class CelEvalError(Exception):
    """A CEL evaluation error (an error value in CEL terms); `&&`, `||` and the macros may absorb it."""


class CostLimitExceeded(CelEvalError):
    """The runtime cost limit was reached; never absorbed."""


@dataclass(frozen=True)
class CelTypeValue:
    """A CEL type used as a value (`type(x)`, `int`, ...)."""

    name: str

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True, eq=False)
class Optional:
    """optional(T): `value` is meaningful only when `present`."""

    present: bool
    value: Any = None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Optional):
            return NotImplemented
        if self.present != other.present:
            return False
        return not self.present or cel_equal(self.value, other.value)

    def __hash__(self) -> int:
        return hash(self.present)


NONE: Final = Optional(False)


# (Python type, its CEL type name, the Go type cel-go names), in the order values are matched: bool before int (a
# bool is an int), UInt before int. "" : cel-go's Go name is not one this engine prints (the Python name stands).
_TYPE_NAMES: Final[tuple[tuple[type | UnionType, str, str], ...]] = (
    (bool, "bool", "types.Bool"),
    (UInt, "uint", "types.Uint"),
    (int, "int", "types.Int"),
    (float, "double", "types.Double"),
    (str, "string", "types.String"),
    (bytes, "bytes", "types.Bytes"),
    (type(None), "null_type", "types.Null"),
    (list | tuple, "list", ""),
    (Mapping, "map", ""),
    (Quantity, "kubernetes.Quantity", "cel.Quantity"),
    (Semver, "kubernetes.Semver", "cel.Semver"),
    (Optional, "optional_type", "*types.Optional"),
    (CelTypeValue, "type", ""),
)


def type_name(value: object) -> str:
    """The CEL type name of a value, as cel-go prints it in errors."""
    for kind, name, _ in _TYPE_NAMES:
        if isinstance(value, kind):
            return name
    named = getattr(value, "cel_type_name", None)
    return str(named) if named else type(value).__name__


def go_type_name(value: object) -> str:
    """The Go type cel-go names in "got 'types.Int', expected iterable type"."""
    for kind, _, name in _TYPE_NAMES:
        if isinstance(value, kind):
            return name or type(value).__name__
    return type(value).__name__


def no_such_overload(name: str, *args: object) -> CelEvalError:
    return CelEvalError(f"no such overload: {name}({', '.join(type_name(a) for a in args)})")


def check_int(value: int) -> int:
    if value > INT_MAX or value < INT_MIN:
        raise CelEvalError("integer overflow")
    return value


def check_uint(value: int) -> UInt:
    if value > UINT_MAX or value < 0:
        raise CelEvalError("unsigned integer overflow")
    return UInt(value)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def cel_equal(a: object, b: object) -> bool:
    """CEL's heterogeneous equality: numbers by value across int/uint/double, aggregates element-wise,
    values of different types are unequal (never an error)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a is b
    if _is_number(a) and _is_number(b):
        return bool(a == b)  # NaN != NaN, as in CEL
    if type(a) is type(b) and isinstance(a, str | bytes):
        return a == b
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(cel_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        if len(a) != len(b):
            return False
        for key, value in a.items():
            found = map_lookup(b, key)
            if found is _ABSENT or not cel_equal(value, found):
                return False
        return True
    if a is None or b is None:
        return a is None and b is None
    if type(a) is not type(b):
        return False
    return a == b


_ABSENT: Final = object()


def map_lookup(m: Mapping[Any, Any], key: object) -> Any:
    """m[key] with CEL's key rules (numeric keys match across int/uint/double of equal value; bool keys
    only bool); _ABSENT when missing."""
    if isinstance(key, str):
        return m.get(key, _ABSENT)
    if isinstance(key, bool):
        for k, v in m.items():
            if isinstance(k, bool) and k is key:
                return v
        return _ABSENT
    if isinstance(key, float):
        if not key.is_integer():
            return _ABSENT
        key = int(key)
    if isinstance(key, int):
        for k, v in m.items():
            if isinstance(k, int) and not isinstance(k, bool) and k == key:
                return v
        return _ABSENT
    raise CelEvalError(f"unsupported key type: {type_name(key)}")


def cel_compare(name: str, a: object, b: object) -> int:
    """-1/0/1 for ordered CEL values (cross-type numeric), else no such overload."""
    if isinstance(a, bool) and isinstance(b, bool):
        return (a > b) - (a < b)
    if _is_number(a) and _is_number(b):
        if (isinstance(a, float) and math.isnan(a)) or (isinstance(b, float) and math.isnan(b)):
            raise _NaN
        x, y = cast(float, a), cast(float, b)
        return (x > y) - (x < y)
    if isinstance(a, str) and isinstance(b, str):
        return (a > b) - (a < b)
    if isinstance(a, bytes) and isinstance(b, bytes):
        return (a > b) - (a < b)
    compare = getattr(a, "compare", None)
    if compare is not None and type(a) is type(b) and (
        isinstance(a, Quantity | Semver) or getattr(a, "cel_type_name", None) in _ORDERED
    ):
        return int(compare(b))
    raise no_such_overload(name, a, b)


# dra_driver.cel.timelib's values (that module imports this one).
_ORDERED: Final = frozenset({"google.protobuf.Timestamp", "google.protobuf.Duration"})


class _NaNComparison(CelEvalError):
    pass


_NaN: Final = _NaNComparison("NaN")


def is_sequence(value: object) -> bool:
    return isinstance(value, list | tuple)


def as_list(value: object) -> Sequence[Any]:
    if isinstance(value, list | tuple):
        return value
    raise CelEvalError(f"got '{go_type_name(value)}', expected list")
