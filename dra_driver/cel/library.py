"""The Kubernetes CEL functions that DRA selectors may call: the quantity and semver libraries.

Each function receives celpy values and returns a celpy value. Errors are *returned* as
CELEvalError values (celpy's convention) carrying a precise message, because an exception raised from
here would be reported by celpy under a misleading generic label ("return error for overflow").
celpy dispatches `x.f(y)` to `f(x, y)` by name only, so functions shared by Quantity and Semver
(compareTo, isGreaterThan, isLessThan) dispatch on the receiver's type.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celpy import celtypes
from celpy.evaluation import CELEvalError

from dra_driver.k8s.quantity import Quantity, QuantityError, parse_quantity
from dra_driver.k8s.semver import Semver, SemverError, is_semver, parse_semver

__all__ = ["FUNCTIONS", "to_cel_value"]

CelFunction = Callable[..., Any]


def _type_name(value: object) -> str:
    if isinstance(value, Quantity):
        return "Quantity"
    if isinstance(value, Semver):
        return "Semver"
    if isinstance(value, celtypes.BoolType):
        return "bool"
    if isinstance(value, celtypes.IntType):
        return "int"
    if isinstance(value, celtypes.UintType):
        return "uint"
    if isinstance(value, celtypes.DoubleType):
        return "double"
    if isinstance(value, celtypes.StringType | str):
        return "string"
    if isinstance(value, celtypes.MapType):
        return "map"
    if isinstance(value, celtypes.ListType):
        return "list"
    return type(value).__name__


def _no_overload(name: str, *args: object) -> CELEvalError:
    signature = ", ".join(_type_name(a) for a in args)
    return CELEvalError(f"no such overload: {name}({signature})", TypeError, None)


def _is_int(value: object) -> bool:
    return isinstance(value, celtypes.IntType) and not isinstance(value, celtypes.BoolType)


def _is_string(value: object) -> bool:
    return isinstance(value, str)


def _is_bool(value: object) -> bool:
    return isinstance(value, celtypes.BoolType)


# -- quantity library ---------------------------------------------------------------------------


def _quantity(text: object) -> Any:
    if not _is_string(text):
        return _no_overload("quantity", text)
    try:
        return parse_quantity(str(text))
    except QuantityError as err:
        return CELEvalError(str(err), ValueError, None)


def _is_quantity(text: object) -> Any:
    if not _is_string(text):
        return _no_overload("isQuantity", text)
    try:
        parse_quantity(str(text))
    except QuantityError:
        return celtypes.BoolType(False)
    return celtypes.BoolType(True)


def _compare(name: str, a: object, b: object) -> int | CELEvalError:
    if isinstance(a, Quantity) and isinstance(b, Quantity):
        return a.compare(b)
    if isinstance(a, Semver) and isinstance(b, Semver):
        return a.compare(b)
    return _no_overload(name, a, b)


def _compare_to(a: object, b: object) -> Any:
    result = _compare("compareTo", a, b)
    return result if isinstance(result, CELEvalError) else celtypes.IntType(result)


def _is_greater_than(a: object, b: object) -> Any:
    result = _compare("isGreaterThan", a, b)
    return result if isinstance(result, CELEvalError) else celtypes.BoolType(result > 0)


def _is_less_than(a: object, b: object) -> Any:
    result = _compare("isLessThan", a, b)
    return result if isinstance(result, CELEvalError) else celtypes.BoolType(result < 0)


def _arith(name: str, q: object, other: object) -> Any:
    operand: Quantity | int
    if isinstance(other, Quantity):
        operand = other
    elif isinstance(other, celtypes.IntType) and not isinstance(other, celtypes.BoolType):
        operand = int(other)
    else:
        return _no_overload(name, q, other)
    if not isinstance(q, Quantity):
        return _no_overload(name, q, other)
    return q.add(operand) if name == "add" else q.sub(operand)


def _add(q: object, other: object) -> Any:
    return _arith("add", q, other)


def _sub(q: object, other: object) -> Any:
    return _arith("sub", q, other)


def _sign(q: object) -> Any:
    if not isinstance(q, Quantity):
        return _no_overload("sign", q)
    return celtypes.IntType(q.sign())


def _is_integer(q: object) -> Any:
    if not isinstance(q, Quantity):
        return _no_overload("isInteger", q)
    return celtypes.BoolType(q.is_integer())


def _as_integer(q: object) -> Any:
    if not isinstance(q, Quantity):
        return _no_overload("asInteger", q)
    try:
        return celtypes.IntType(q.as_int64())
    except QuantityError as err:
        return CELEvalError(str(err), ValueError, None)


def _as_approximate_float(q: object) -> Any:
    if not isinstance(q, Quantity):
        return _no_overload("asApproximateFloat", q)
    return celtypes.DoubleType(q.as_approximate_float())


# -- semver library -----------------------------------------------------------------------------


def _semver(text: object, normalize: object = None) -> Any:
    if not _is_string(text) or not (normalize is None or _is_bool(normalize)):
        return _no_overload("semver", text) if normalize is None else _no_overload("semver", text, normalize)
    try:
        return parse_semver(str(text), bool(normalize))
    except SemverError as err:
        return CELEvalError(str(err), ValueError, None)


def _is_semver(text: object, normalize: object = None) -> Any:
    if not _is_string(text) or not (normalize is None or _is_bool(normalize)):
        return _no_overload("isSemver", text) if normalize is None else _no_overload("isSemver", text, normalize)
    return celtypes.BoolType(is_semver(str(text), bool(normalize)))


def _component(name: str) -> CelFunction:
    def component(v: object) -> Any:
        if not isinstance(v, Semver):
            return _no_overload(name, v)
        value: int = getattr(v, name)
        return celtypes.IntType(value)

    return component


FUNCTIONS: dict[str, CelFunction] = {
    "quantity": _quantity,
    "isQuantity": _is_quantity,
    "compareTo": _compare_to,
    "isGreaterThan": _is_greater_than,
    "isLessThan": _is_less_than,
    "add": _add,
    "sub": _sub,
    "sign": _sign,
    "isInteger": _is_integer,
    "asInteger": _as_integer,
    "asApproximateFloat": _as_approximate_float,
    "semver": _semver,
    "isSemver": _is_semver,
    "major": _component("major"),
    "minor": _component("minor"),
    "patch": _component("patch"),
}


def to_cel_value(value: int | bool | str | Semver | Quantity) -> Any:
    """Convert one typed DRA value (attribute or capacity) to the value a selector sees."""
    if isinstance(value, bool):
        return celtypes.BoolType(value)
    if isinstance(value, int):
        return celtypes.IntType(value)
    if isinstance(value, str):
        return celtypes.StringType(value)
    return value  # Semver and Quantity are CEL values as they are
