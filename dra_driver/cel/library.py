"""The functions of Kubernetes' DRA CEL environment: their overloads (for the checker) and implementations.

Which library each comes from, and since which Kubernetes release, is in docs/allocator.md ("CEL
functions"); the names and signatures are the ones cel-go and k8s.io/apiserver/pkg/cel/library declare.
Implementations receive evaluated CEL values (dra_driver.cel.runtime) and raise CelEvalError.
"""

from __future__ import annotations

import functools
import itertools
import math
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from dra_driver.cel import netlib, regex, timelib
from dra_driver.cel.netlib import CIDR as CidrValue
from dra_driver.cel.netlib import IP as IpValue
from dra_driver.cel.netlib import URL as UrlValue
from dra_driver.cel.netlib import NamedFormat
from dra_driver.cel.runtime import (
    _ABSENT,
    INT_MIN,
    NONE,
    CelEvalError,
    CelTypeValue,
    Optional,
    cel_compare,
    cel_equal,
    check_int,
    check_uint,
    map_lookup,
    no_such_overload,
    type_name,
)
from dra_driver.cel.syntax import UInt
from dra_driver.cel.timelib import Duration, Timestamp
from dra_driver.cel.types import (
    BOOL,
    BYTES,
    CIDR,
    DOUBLE,
    DURATION,
    DYN,
    FORMAT,
    INT,
    IP,
    QUANTITY,
    SEMVER,
    STRING,
    TIMESTAMP,
    TYPE,
    UINT,
    URL,
    CelType,
    list_of,
    map_of,
    optional_of,
    param,
)
from dra_driver.k8s.quantity import Quantity, QuantityError, parse_quantity
from dra_driver.k8s.semver import Semver, SemverError, is_semver, parse_semver

__all__ = ["FUNCTIONS", "Function", "Overload", "to_cel_value"]

A: Final = param("A")
B: Final = param("B")


@dataclass(frozen=True)
class Overload:
    params: tuple[CelType, ...]  # the receiver first, for member overloads
    result: CelType
    member: bool = False


@dataclass(frozen=True)
class Function:
    name: str
    overloads: tuple[Overload, ...]
    impl: Callable[..., Any]
    library: str  # see docs/allocator.md
    # Extra cost-estimate factor per character of the receiver (k8s library CostEstimator), see checker.
    traversal: float = 0.0


_R = TypeVar("_R")  # the receiver type of _method_of, the argument of _cidr_contains
_V = TypeVar("_V")  # what a function of strings returns
_W = TypeVar("_W")  # what timestamp() or duration() returns


def _m(*params: CelType, result: CelType) -> Overload:
    return Overload(tuple(params), result, member=True)


def _g(*params: CelType, result: CelType) -> Overload:
    return Overload(tuple(params), result, member=False)


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool | UInt)


def _str(name: str, *args: object) -> None:
    for a in args:
        if not isinstance(a, str):
            raise no_such_overload(name, *args)


def _of_strings(name: str, impl: Callable[..., _V]) -> Callable[..., _V]:
    """A function of strings only (contains, url, isIP, cidr, ...); any other argument is `no such overload`."""
    def call(*args: object) -> _V:
        _str(name, *args)
        return impl(*args)

    return call


def _int_arg(name: str, value: object, *all_args: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool | UInt):
        raise no_such_overload(name, *all_args)
    return int(value)


def _strings_and_count(name: str, strings: tuple[object, ...], n: object) -> tuple[list[str], int]:
    """The arguments of a function of strings with an optional count last (replace, split, findAll): the strings,
    and the count (-1, no limit, when not given); other types are `no such overload`."""
    args = strings if n is None else (*strings, n)
    texts = [a for a in strings if isinstance(a, str)]
    if len(texts) != len(strings):
        raise no_such_overload(name, *args)
    return texts, -1 if n is None else _int_arg(name, n, *args)


# -- CEL standard functions ----------------------------------------------------------------------


def _size(value: object) -> int:
    if isinstance(value, str | bytes | list | tuple | Mapping):
        return len(value)
    raise no_such_overload("size", value)


def _number(text: str, parse: Callable[[str], _V], kind: str) -> _V:
    """int(), uint(), double() of a string: its number, or CEL's conversion error."""
    try:
        return parse(text)
    except ValueError:
        raise CelEvalError(f"cannot convert string '{text}' to {kind}") from None


def _to_integer(name: str, check: Callable[[int], _V], low: float, high: float) -> Callable[[object], _V]:
    """int() and uint() of an integer, a double in [low, high) (truncated) or a decimal string."""
    def convert(v: object) -> _V:
        if isinstance(v, bool):
            raise no_such_overload(name, v)
        if isinstance(v, int):
            return check(int(v))
        if isinstance(v, float):
            if math.isnan(v) or not (low <= v < high):
                raise CelEvalError(f"double is out of range for {name}")
            return check(int(v))
        if isinstance(v, str):
            return check(_number(v, int, name))
        raise no_such_overload(name, v)

    return convert


_to_int64: Final = _to_integer("int", check_int, INT_MIN, 2.0**63)
_to_uint: Final = _to_integer("uint", check_uint, 0, 2.0**64)


def _to_int(v: object) -> int:
    if isinstance(v, Timestamp):
        return v.seconds  # Unix seconds
    if isinstance(v, Duration):
        return v.nanos
    return _to_int64(v)


def _to_double(v: object) -> float:
    if isinstance(v, bool):
        raise no_such_overload("double", v)
    if isinstance(v, int | float):
        return float(v)
    if isinstance(v, str):
        return _number(v, float, "double")
    raise no_such_overload("double", v)


def format_value(v: object) -> str:
    """string(x) for scalars; the format library's %s for aggregates."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(int(v))
    if isinstance(v, float):
        return _format_double(v)
    if isinstance(v, str):
        return v
    if isinstance(v, bytes):
        return v.decode("utf-8", errors="replace")
    if v is None:
        return "null"
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_format_nested(x) for x in v) + "]"
    if isinstance(v, Mapping):
        items = sorted(((_format_nested(k), _format_nested(x)) for k, x in v.items()))
        return "{" + ", ".join(f"{k}: {x}" for k, x in items) + "}"
    return str(v)


def _format_nested(v: object) -> str:
    if isinstance(v, str):
        return quote(v)
    # ext/formatting.go prints timestamps and durations inside lists and maps as CEL literals.
    if isinstance(v, Timestamp):
        return f'timestamp("{v}")'
    if isinstance(v, Duration):
        return f'duration("{v}")'
    return format_value(v)


def _format_double(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if v == int(v) and abs(v) < 1e21:
        return str(int(v))
    text = repr(v)
    if "e" in text:
        mantissa, exp = text.split("e")
        sign = "-" if exp.startswith("-") else "+"
        return f"{mantissa}e{sign}{abs(int(exp)):02d}"
    return text


def _to_string(v: object) -> str:
    if isinstance(v, bytes):
        try:
            return v.decode("utf-8")
        except UnicodeDecodeError:
            raise CelEvalError("invalid UTF-8 in bytes, cannot convert to string") from None
    if isinstance(v, bool | int | float | str | Timestamp | Duration | IpValue | CidrValue):
        return format_value(v)
    raise no_such_overload("string", v)


def _to_bytes(v: object) -> bytes:
    if isinstance(v, bytes):
        return v
    if isinstance(v, str):
        return v.encode("utf-8")
    raise no_such_overload("bytes", v)


def _to_bool(v: object) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, str):
        if v in ("true", "True", "TRUE", "t", "1"):
            return True
        if v in ("false", "False", "FALSE", "f", "0"):
            return False
        raise CelEvalError("type conversion error from 'string' to 'bool'")
    raise no_such_overload("bool", v)


def _dyn(v: object) -> object:
    return v


def _type(v: object) -> CelTypeValue:
    return CelTypeValue(type_name(v))


# -- strings extension (cel-go ext.Strings, version 2) ------------------------------------------


def _char_at(s: object, i: object) -> str:
    _str("charAt", s)
    idx = _int_arg("charAt", i, s, i)
    text: str = s  # type: ignore[assignment]
    if idx < 0 or idx > len(text):
        raise CelEvalError(f"index out of range: {idx}")
    return text[idx] if idx < len(text) else ""


def _index_finder(last: bool) -> Callable[..., int]:
    """indexOf or lastIndexOf: of a substring in a string (with an optional offset), or of a value in a list."""
    name = "lastIndexOf" if last else "indexOf"
    in_list = _list_last_index_of if last else _list_index_of

    def find(s: object, sub: object, start: object = None) -> int:
        args = (s, sub) if start is None else (s, sub, start)
        if not (isinstance(s, str) and isinstance(sub, str)):
            if isinstance(s, list | tuple) and start is None:
                return in_list(s, sub)
            raise no_such_overload(name, *args)
        if start is None:
            return s.rfind(sub) if last else s.find(sub)
        # cel-go v0.26 indexOfOffset/lastIndexOfOffset: "" gives the offset unchecked; past the end gives -1.
        pos = _int_arg(name, start, *args)
        if sub == "":
            return pos
        if pos < 0:
            raise CelEvalError(f"index out of range: {pos}")
        if pos >= len(s):
            return -1
        if not last:
            return s.find(sub, pos)
        pos = min(pos, len(s) - len(sub))
        return s.rfind(sub, 0, pos + len(sub)) if pos >= 0 else -1

    return find


def _ascii_case(upper: bool) -> Callable[[object], str]:
    name = "upperAscii" if upper else "lowerAscii"
    table = str.maketrans(
        "abcdefghijklmnopqrstuvwxyz" if upper else "ABCDEFGHIJKLMNOPQRSTUVWXYZ",
        "ABCDEFGHIJKLMNOPQRSTUVWXYZ" if upper else "abcdefghijklmnopqrstuvwxyz",
    )

    def convert(s: object) -> str:
        if not isinstance(s, str):
            raise no_such_overload(name, s)
        return s.translate(table)

    return convert


def _replace(s: object, old: object, new: object, n: object = None) -> str:
    (s, old, new), count = _strings_and_count("replace", (s, old, new), n)
    if count < 0:
        return s.replace(old, new)
    return s.replace(old, new, count)


def _split(s: object, sep: object, n: object = None) -> list[str]:
    (s, sep), limit = _strings_and_count("split", (s, sep), n)
    # Go strings.SplitN semantics.
    if limit == 0:
        return []
    if sep == "":
        chars = list(s)
        if limit > 0 and len(chars) > limit:
            return [*chars[: limit - 1], "".join(chars[limit - 1 :])]
        return chars
    if limit < 0:
        return s.split(sep)
    return s.split(sep, limit - 1)


def _substring(s: object, start: object, end: object = None) -> str:
    args = (s, start) if end is None else (s, start, end)
    _str("substring", s)
    text: str = s  # type: ignore[assignment]
    lo = _int_arg("substring", start, *args)
    hi = len(text) if end is None else _int_arg("substring", end, *args)
    if lo < 0 or lo > len(text):
        raise CelEvalError(f"index out of range: {lo}")
    if hi < 0 or hi > len(text):
        raise CelEvalError(f"index out of range: {hi}")
    if lo > hi:
        raise CelEvalError(f"invalid substring range. start: {lo}, end: {hi}")
    return text[lo:hi]


# Go's unicode.IsSpace (strings.TrimSpace, which ext.Strings' trim uses).
_UNICODE_SPACE: Final = (
    "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u2028\u2029\u202f\u205f\u3000"
)


def _trim(s: object) -> str:
    if not isinstance(s, str):
        raise no_such_overload("trim", s)
    return s.strip(_UNICODE_SPACE)


def _join(items: object, sep: object = "") -> str:
    if not isinstance(items, list | tuple) or not isinstance(sep, str):
        raise no_such_overload("join", items) if sep == "" else no_such_overload("join", items, sep)
    for x in items:
        if not isinstance(x, str):
            raise no_such_overload("join", items, sep)
    return sep.join(items)


# What strings.quote escapes (cel-go ext.Strings); every other character stands as it is.
_QUOTE_ESCAPES: Final = {
    '"': '\\"', "\\": "\\\\", "\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t",
    "\v": "\\v",
}


def quote(s: str) -> str:
    return '"' + "".join(_QUOTE_ESCAPES.get(c, c) for c in s) + '"'


def _format(fmt: object, args: object) -> str:
    if not isinstance(fmt, str) or not isinstance(args, list | tuple):
        raise no_such_overload("format", fmt, args)
    out: list[str] = []
    i = 0
    arg = 0
    while i < len(fmt):
        c = fmt[i]
        if c != "%":
            out.append(c)
            i += 1
            continue
        i += 1
        if i >= len(fmt):
            raise CelEvalError("unexpected end of format string")
        if fmt[i] == "%":
            out.append("%")
            i += 1
            continue
        precision: int | None = None
        if fmt[i] == ".":
            j = i + 1
            while j < len(fmt) and fmt[j].isdigit():
                j += 1
            precision = int(fmt[i + 1 : j] or "0")
            i = j
        if i >= len(fmt):
            raise CelEvalError("unexpected end of format string")
        verb = fmt[i]
        i += 1
        if arg >= len(args):
            raise CelEvalError(f"index {arg} out of range")
        value = args[arg]
        arg += 1
        out.append(_format_clause(verb, value, precision))
    return "".join(out)


def _format_error(what: str, value: object) -> CelEvalError:
    return CelEvalError(f"error during formatting: {what}, was given {type_name(value)}")


def _format_clause(verb: str, value: object, precision: int | None) -> str:
    if verb == "s":
        if isinstance(value, IpValue | CidrValue | UrlValue | NamedFormat | Optional):
            raise _format_error(
                "string clause can only be used on strings, bools, bytes, ints, doubles, maps, lists, types, "
                "durations, and timestamps",
                value,
            )
        return format_value(value)
    if verb == "d":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _format_error("decimal clause can only be used on integers", value)
        if isinstance(value, float):
            raise CelEvalError("error during formatting: decimal clause can only be used on integers, was given double")
        return str(int(value))
    if verb in "fe":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _format_error("fixed-point clause can only be used on doubles", value)
        p = 6 if precision is None else precision
        f = float(value)
        if math.isnan(f):
            return "NaN"
        if math.isinf(f):
            return "Infinity" if f > 0 else "-Infinity"
        return f"{f:.{p}{verb}}"
    if verb == "b":
        if isinstance(value, bool):
            return "1" if value else "0"
        if isinstance(value, int):
            return format(int(value), "b")
        raise _format_error("only integers and bools can be formatted as binary", value)
    if verb in "xX":
        if isinstance(value, bool):
            raise _format_error("only integers, byte buffers, and strings can be formatted as hex", value)
        if isinstance(value, int):
            text = format(int(value), "x")
        elif isinstance(value, str):
            text = value.encode("utf-8").hex()
        elif isinstance(value, bytes):
            text = value.hex()
        else:
            raise _format_error("only integers, byte buffers, and strings can be formatted as hex", value)
        return text.upper() if verb == "X" else text
    if verb == "o":
        if isinstance(value, int) and not isinstance(value, bool):
            return format(int(value), "o")
        raise _format_error("octal clause can only be used on integers", value)
    raise CelEvalError(f'could not parse formatting clause: unrecognized formatting clause "{verb}"')


# -- Kubernetes lists library (k8s.io/apiserver/pkg/cel/library/lists.go) -----------------------


def _list_elems(name: str, value: object) -> Sequence[Any]:
    if not isinstance(value, list | tuple):
        raise no_such_overload(name, value)
    return value


def _is_sorted(items: object) -> bool:
    values = _list_elems("isSorted", items)
    return all(cel_compare("isSorted", a, b) <= 0 for a, b in itertools.pairwise(values))


def _sum(items: object) -> object:
    values = _list_elems("sum", items)
    if not values:
        return 0
    total = values[0]
    for v in values[1:]:
        total = _add(total, v)
    return total


def _extreme(name: str, sign: int) -> Callable[[object], object]:
    def pick(items: object) -> object:
        values = _list_elems(name, items)
        if not values:
            raise CelEvalError(f"{name}(list) argument must not be empty")
        best = values[0]
        for v in values[1:]:
            if cel_compare(name, v, best) * sign > 0:
                best = v
        return best

    return pick


def _list_index_of(items: Sequence[Any], value: object) -> int:
    for i, v in enumerate(items):
        if cel_equal(v, value):
            return i
    return -1


def _list_last_index_of(items: Sequence[Any], value: object) -> int:
    for i in range(len(items) - 1, -1, -1):
        if cel_equal(items[i], value):
            return i
    return -1


MAX_INCLUDES_LIST: Final = 48  # resource.k8s.io ResourceSliceMaxAttributeValuesPerDevice


def _includes(target: object, value: object) -> bool:
    if isinstance(target, list | tuple):
        for i, v in enumerate(target):
            if i >= MAX_INCLUDES_LIST:
                raise CelEvalError(
                    f"'includes' function cannot be applied to lists longer than {MAX_INCLUDES_LIST} values"
                )
            if cel_equal(v, value):
                return True
        return False
    return cel_equal(target, value)


# -- lists extension (cel-go ext.Lists, version 3) ------------------------------------------------


def _slice(items: object, start: object, end: object) -> list[Any]:
    values = _list_elems("slice", items)
    lo, hi = _int_arg("slice", start, items, start, end), _int_arg("slice", end, items, start, end)
    if lo < 0 or hi < 0:
        raise CelEvalError(f"cannot slice(start={lo}, end={hi}), negative indexes not supported")
    if lo > hi:
        raise CelEvalError(f"cannot slice(start={lo}, end={hi}), start index must be less than or equal to end index")
    if hi > len(values):
        raise CelEvalError(f"cannot slice(start={lo}, end={hi}), list is length {len(values)}")
    return list(values[lo:hi])


def _flatten(items: object, depth: object = 1) -> list[Any]:
    values = _list_elems("flatten", items)
    d = _int_arg("flatten", depth, items, depth)
    if d < 0:
        raise CelEvalError("level must be non-negative")
    out: list[Any] = []
    for v in values:
        if isinstance(v, list | tuple) and d > 0:
            out.extend(_flatten(v, d - 1))
        else:
            out.append(v)
    return out


def _sort(items: object) -> list[Any]:
    values = list(_list_elems("sort", items))
    kinds = {type_name(v) for v in values}
    if len(kinds) > 1:
        raise CelEvalError("list elements must have the same type")
    return sorted(values, key=functools.cmp_to_key(lambda a, b: cel_compare("sort", a, b)))


def _range(n: object) -> list[int]:
    count = _int_arg("lists.range", n, n)
    return list(range(max(count, 0)))


def _reverse(items: object) -> list[Any]:
    return list(reversed(_list_elems("reverse", items)))


def _distinct(items: object) -> list[Any]:
    out: list[Any] = []
    for v in _list_elems("distinct", items):
        if _list_index_of(out, v) < 0:
            out.append(v)
    return out


def _first(items: object) -> Optional:
    values = _list_elems("first", items)
    return Optional(True, values[0]) if values else NONE


def _last(items: object) -> Optional:
    values = _list_elems("last", items)
    return Optional(True, values[-1]) if values else NONE


# -- sets extension (cel-go ext.Sets) -------------------------------------------------------------


def _sets_contains(a: object, b: object) -> bool:
    la, lb = _list_elems("sets.contains", a), _list_elems("sets.contains", b)
    return all(_list_index_of(la, x) >= 0 for x in lb)


def _sets_equivalent(a: object, b: object) -> bool:
    return _sets_contains(a, b) and _sets_contains(b, a)


def _sets_intersects(a: object, b: object) -> bool:
    la, lb = _list_elems("sets.intersects", a), _list_elems("sets.intersects", b)
    return any(_list_index_of(la, x) >= 0 for x in lb)


# -- regex library (k8s.io/apiserver/pkg/cel/library/regex.go) -----------------------------------


def _find(s: object, pattern: object) -> str:
    _str("find", s, pattern)
    m = regex.compile_pattern(pattern).search(s)  # type: ignore[arg-type]
    return m.group(0) if m else ""


def _find_all(s: object, pattern: object, limit: object = None) -> list[str]:
    (s, pattern), n = _strings_and_count("findAll", (s, pattern), limit)
    if n == 0:
        return []
    found = [m.group(0) for m in regex.compile_pattern(pattern).finditer(s)]
    return found if n < 0 else found[:n]


# -- optional types (cel-go cel.OptionalTypes) ----------------------------------------------------


def _optional_of(v: object) -> Optional:
    return Optional(True, v)


def _optional_none() -> Optional:
    return NONE


def _is_zero(v: object) -> bool:
    if v is None:
        return True
    if isinstance(v, bool):
        return v is False
    if isinstance(v, int | float):
        return v == 0
    if isinstance(v, str | bytes | list | tuple | Mapping):
        return len(v) == 0
    return False


def _optional_of_non_zero(v: object) -> Optional:
    return NONE if _is_zero(v) else Optional(True, v)


def _opt(name: str, v: object, *rest: object) -> Optional:
    if not isinstance(v, Optional):
        raise no_such_overload(name, v, *rest)
    return v


def _has_value(v: object) -> bool:
    return _opt("hasValue", v).present


def _value(v: object) -> object:
    opt = _opt("value", v)
    if not opt.present:
        raise CelEvalError("optional.none() dereference")
    return opt.value


def _or_value(v: object, other: object) -> object:
    opt = _opt("orValue", v, other)
    return opt.value if opt.present else other


def _or(v: object, other: object) -> Optional:
    opt = _opt("or", v, other)
    if opt.present:
        return opt
    return _opt("or", other)


def _unwrap(items: object) -> list[Any]:
    out: list[Any] = []
    for v in _list_elems("optional.unwrap", items):
        opt = _opt("optional.unwrap", v)
        if opt.present:
            out.append(opt.value)
    return out


# -- quantity library (k8s.io/apiserver/pkg/cel/library/quantity.go) -----------------------------


# apimachinery resource.ParseQuantity's two errors, as the quantity library returns them.
_QUANTITY_SHAPE: Final = re.compile(r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$")
_QUANTITY_SHAPE_ERROR: Final = (
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
)


def _quantity(text: object) -> Quantity:
    _str("quantity", text)
    try:
        return parse_quantity(text)  # type: ignore[arg-type]
    except QuantityError as err:
        if not _QUANTITY_SHAPE.match(str(text)):
            raise CelEvalError(f"{_QUANTITY_SHAPE_ERROR}: {err}") from None
        raise CelEvalError(f"unable to parse quantity's suffix: {err}") from None


def _is_quantity(text: object) -> bool:
    _str("isQuantity", text)
    try:
        parse_quantity(text)  # type: ignore[arg-type]
    except QuantityError:
        return False
    return True


def _compare(name: str, a: object, b: object) -> int:
    if (isinstance(a, Quantity) and isinstance(b, Quantity)) or (isinstance(a, Semver) and isinstance(b, Semver)):
        return a.compare(b)  # type: ignore[arg-type]
    raise no_such_overload(name, a, b)


def _compare_to(a: object, b: object) -> int:
    return _compare("compareTo", a, b)


def _is_greater_than(a: object, b: object) -> bool:
    return _compare("isGreaterThan", a, b) > 0


def _is_less_than(a: object, b: object) -> bool:
    return _compare("isLessThan", a, b) < 0


def _quantity_arith(name: str) -> Callable[[object, object], Quantity]:
    def apply(q: object, other: object) -> Quantity:
        if not isinstance(q, Quantity) or not (isinstance(other, Quantity) or _is_int(other)):
            raise no_such_overload(name, q, other)
        operand: Quantity | int = other if isinstance(other, Quantity) else int(other)  # type: ignore[call-overload]
        return q.add(operand) if name == "add" else q.sub(operand)

    return apply


def _q(name: str, q: object) -> Quantity:
    if not isinstance(q, Quantity):
        raise no_such_overload(name, q)
    return q


def _sign(q: object) -> int:
    return _q("sign", q).sign()


def _is_integer(q: object) -> bool:
    return _q("isInteger", q).is_integer()


def _as_integer(q: object) -> int:
    try:
        return _q("asInteger", q).as_int64()
    except QuantityError:
        raise CelEvalError("cannot convert value to integer") from None  # the quantity library's words


def _as_approximate_float(q: object) -> float:
    return _q("asApproximateFloat", q).as_approximate_float()


# -- semver library (k8s.io/apiserver/pkg/cel/library/semverlib.go) ------------------------------


def _semver(text: object, normalize: object = None) -> Semver:
    args = (text,) if normalize is None else (text, normalize)
    if not isinstance(text, str) or not (normalize is None or isinstance(normalize, bool)):
        raise no_such_overload("semver", *args)
    try:
        return parse_semver(text, bool(normalize))
    except SemverError as err:
        raise CelEvalError(str(err)) from None


def _is_semver(text: object, normalize: object = None) -> bool:
    args = (text,) if normalize is None else (text, normalize)
    if not isinstance(text, str) or not (normalize is None or isinstance(normalize, bool)):
        raise no_such_overload("isSemver", *args)
    return is_semver(text, bool(normalize))


def _component(name: str) -> Callable[[object], int]:
    def component(v: object) -> int:
        if not isinstance(v, Semver):
            raise no_such_overload(name, v)
        value: int = getattr(v, name)
        return value

    return component


# -- operators -----------------------------------------------------------------------------------


def _arithmetic(
    name: str,
    op: Callable[[Any, Any], Any],
    other: Callable[[object, object], object] | None = None,
    *,
    doubles: bool = True,
) -> Callable[[object, object], object]:
    """`+`, `-`, `*`, `/`, `%`: uint with uint and int with int (overflow is an error), double with double (unless
    not `doubles`); then `other`'s overloads (strings, lists, times), which answer _ABSENT for operands they do not
    take."""
    def apply(a: object, b: object) -> object:
        if isinstance(a, bool) or isinstance(b, bool):
            raise no_such_overload(name, a, b)
        if isinstance(a, UInt) and isinstance(b, UInt):
            return check_uint(op(a, b))
        if _is_int(a) and _is_int(b):
            return check_int(op(a, b))
        if doubles and isinstance(a, float) and isinstance(b, float):
            return op(a, b)
        result = _ABSENT if other is None else other(a, b)
        if result is _ABSENT:
            raise no_such_overload(name, a, b)
        return result

    return apply


def _add_other(a: object, b: object) -> object:
    if isinstance(a, str) and isinstance(b, str):
        return a + b
    if isinstance(a, bytes) and isinstance(b, bytes):
        return a + b
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return [*a, *b]
    if isinstance(a, Duration):
        if isinstance(b, Duration):
            return a.add(b)
        if isinstance(b, Timestamp):
            return b.add(a)
    if isinstance(a, Timestamp) and isinstance(b, Duration):
        return a.add(b)
    return _ABSENT


def _sub_times(a: object, b: object) -> object:
    if isinstance(a, Timestamp) and isinstance(b, Timestamp | Duration):
        return a.subtract(b)
    if isinstance(a, Duration) and isinstance(b, Duration):
        return a.subtract(b)
    return _ABSENT


_add: Final = _arithmetic("_+_", operator.add, _add_other)
_sub: Final = _arithmetic("_-_", operator.sub, _sub_times)
_mul: Final = _arithmetic("_*_", operator.mul)


def _quotient(a: Any, b: Any) -> Any:
    """Go's `/`: integers truncate toward zero; a double divided by zero is an infinity or NaN (IEEE 754)."""
    if isinstance(a, float):
        if b == 0:
            return math.copysign(math.inf, a) * math.copysign(1, b) if a != 0 and not math.isnan(a) else math.nan
        return a / b
    if b == 0:
        raise CelEvalError("division by zero")
    return abs(a) // abs(b) * (1 if (a >= 0) == (b >= 0) else -1)


def _remainder(a: int, b: int) -> int:
    """Go's `%` of integers: the sign of the dividend."""
    if b == 0:
        raise CelEvalError("modulus by zero")
    return abs(a) % abs(b) * (1 if a >= 0 else -1)


_div: Final = _arithmetic("_/_", _quotient)
_mod: Final = _arithmetic("_%_", _remainder, doubles=False)


def _neg(a: object) -> object:
    if _is_int(a):
        return check_int(-a)  # type: ignore[operator]
    if isinstance(a, float):
        return -a
    raise no_such_overload("-_", a)


def _not(a: object) -> bool:
    if isinstance(a, bool):
        return not a
    raise no_such_overload("!_", a)


def _ordering(name: str, test: Callable[[int], bool]) -> Callable[[object, object], bool]:
    def compare(a: object, b: object) -> bool:
        try:
            return test(cel_compare(name, a, b))
        except CelEvalError as err:
            if str(err) == "NaN":
                return False
            raise

    return compare


def _in(value: object, container: object) -> bool:
    if isinstance(container, list | tuple):
        return any(cel_equal(value, x) for x in container)
    if isinstance(container, Mapping):
        if isinstance(value, str | bool | int | float):
            return map_lookup(container, value) is not _ABSENT
        return False
    raise no_such_overload("@in", value, container)


# -- timestamps and durations (CEL standard; cel-go common/types, common/stdlib) ------------------


def _time_conversion(
    name: str, kind: type[_W], parse: Callable[[str], _W], of_int: Callable[[int], _W]
) -> Callable[[object], _W]:
    """timestamp() or duration(): of its own type, the value; of a string, parsed; of an int, `of_int`'s."""
    def convert(v: object) -> _W:
        if isinstance(v, kind):
            return v
        if isinstance(v, str):
            return parse(v)
        if _is_int(v):
            return of_int(int(v))  # type: ignore[call-overload]
        raise no_such_overload(name, v)

    return convert


_timestamp: Final = _time_conversion("timestamp", Timestamp, timelib.parse_timestamp, timelib.timestamp_from_unix)
_duration: Final = _time_conversion("duration", Duration, timelib.parse_duration, Duration)


_HOUR: Final = 3600 * 10**9
_MINUTE: Final = 60 * 10**9
_SECOND: Final = 10**9
_MILLI: Final = 10**6


def _time_getter(name: str) -> Callable[..., int]:
    """getFullYear ... getMilliseconds: on a timestamp (UTC, or the given zone), and the four that durations
    have (whole hours, minutes, seconds, milliseconds, truncated)."""
    def get(value: object, zone: object = None) -> int:
        if isinstance(value, Duration) and zone is None:
            unit = {"getHours": _HOUR, "getMinutes": _MINUTE, "getSeconds": _SECOND, "getMilliseconds": _MILLI}
            if name in unit:
                return value.truncated(unit[name])
        if not isinstance(value, Timestamp) or not (zone is None or isinstance(zone, str)):
            raise no_such_overload(name, value) if zone is None else no_such_overload(name, value, zone)
        local = value.in_zone("UTC" if zone is None else zone)
        if name == "getFullYear":
            return local.year
        if name == "getMonth":
            return local.month - 1
        if name == "getDayOfYear":
            return local.timetuple().tm_yday - 1
        if name == "getDayOfMonth":
            return local.day - 1
        if name == "getDate":
            return local.day
        if name == "getDayOfWeek":
            return (local.weekday() + 1) % 7  # Sunday is 0
        if name == "getHours":
            return local.hour
        if name == "getMinutes":
            return local.minute
        if name == "getSeconds":
            return local.second
        return value.nanos // _MILLI

    return get


# -- URLs (k8s.io/apiserver/pkg/cel/library/urls.go) ---------------------------------------------


def _method_of(name: str, receiver: type[_R], read: Callable[[_R], Any]) -> Callable[[object], Any]:
    """A method of a URL, IP or CIDR value; any other receiver is `no such overload` (as a dyn value can be)."""
    def call(value: object) -> Any:
        if not isinstance(value, receiver):
            raise no_such_overload(name, value)
        return read(value)

    return call


# -- IP addresses and CIDRs (library/ip.go, library/cidr.go) -------------------------------------

_parse_ip = _of_strings("ip", netlib.parse_ip)


def _ip(v: object) -> IpValue:
    if isinstance(v, CidrValue):
        return v.ip  # <CIDR>.ip()
    return _parse_ip(v)


def _cidr_contains(
    name: str, kind: type[_R], parse: Callable[[str], _R], test: Callable[[CidrValue, _R], bool]
) -> Callable[[object, object], bool]:
    """containsIP, containsCIDR: the other one as a string or a value of its kind."""
    def call(c: object, other: object) -> bool:
        inner = parse(other) if isinstance(c, CidrValue) and isinstance(other, str) else other
        if not isinstance(c, CidrValue) or not isinstance(inner, kind):
            raise no_such_overload(name, c, other)
        return test(c, inner)

    return call


# -- the format library (library/format.go) ------------------------------------------------------


def _format_named(name: object) -> Optional:
    _str("format.named", name)
    found = netlib.FORMATS.get(name)  # type: ignore[call-overload]
    return NONE if found is None else Optional(True, found)


def _constant_format(key: str) -> Callable[[], NamedFormat]:
    value = netlib.FORMATS[key]
    return lambda: value


def _format_validate(f: object, text: object) -> Optional:
    if not isinstance(f, NamedFormat) or not isinstance(text, str):
        raise no_such_overload("validate", f, text)
    problems = f.validate(text)
    return Optional(True, problems) if problems else NONE



# -- the declarations ----------------------------------------------------------------------------

_NUMERIC: Final = (INT, UINT, DOUBLE)
_ORDERED: Final = (INT, UINT, DOUBLE, BOOL, STRING, BYTES, DURATION, TIMESTAMP)


def _cmp_overloads() -> tuple[Overload, ...]:
    same = [_g(t, t, result=BOOL) for t in _ORDERED]
    cross = [_g(a, b, result=BOOL) for a in _NUMERIC for b in _NUMERIC if a != b]
    return tuple(same + cross)


def _fn(name: str, impl: Callable[..., Any], library: str, *overloads: Overload, traversal: float = 0.0) -> Function:
    return Function(name, tuple(overloads), impl, library, traversal)


_STD = "CEL standard"
_STRINGS = "cel-go ext.Strings v2"
_LISTS_K8S = "Kubernetes lists"
_LISTS_EXT = "cel-go ext.Lists v3"
_SETS = "cel-go ext.Sets"
_REGEX = "Kubernetes regex"
_OPTIONAL = "cel-go optional types"
_QUANTITY = "Kubernetes quantity"
_SEMVER = "Kubernetes semver"
_DRA = "DRA"
_TIME = "CEL standard (timestamps and durations)"
_URLS = "Kubernetes URLs"
_IP = "Kubernetes IP"
_CIDR = "Kubernetes CIDR"
_FORMAT = "Kubernetes format"
_STRINGABLE: Final = (INT, UINT, DOUBLE, STRING, BYTES, BOOL, DURATION, TIMESTAMP, IP, CIDR)
_TS_GETTERS: Final = ("getFullYear", "getMonth", "getDayOfYear", "getDayOfMonth", "getDate", "getDayOfWeek",
                      "getHours", "getMinutes", "getSeconds", "getMilliseconds")
_DURATION_GETTERS: Final = ("getHours", "getMinutes", "getSeconds", "getMilliseconds")

_FUNCTION_LIST: Final[tuple[Function, ...]] = (
    # operators
    _fn("_+_", _add, _STD, *(_g(t, t, result=t) for t in (INT, UINT, DOUBLE, STRING, BYTES)),
        _g(list_of(A), list_of(A), result=list_of(A)), _g(DURATION, DURATION, result=DURATION),
        _g(DURATION, TIMESTAMP, result=TIMESTAMP), _g(TIMESTAMP, DURATION, result=TIMESTAMP)),
    _fn("_-_", _sub, _STD, *(_g(t, t, result=t) for t in (INT, UINT, DOUBLE)),
        _g(DURATION, DURATION, result=DURATION), _g(TIMESTAMP, TIMESTAMP, result=DURATION),
        _g(TIMESTAMP, DURATION, result=TIMESTAMP)),
    _fn("_*_", _mul, _STD, *(_g(t, t, result=t) for t in (INT, UINT, DOUBLE))),
    _fn("_/_", _div, _STD, *(_g(t, t, result=t) for t in (INT, UINT, DOUBLE))),
    _fn("_%_", _mod, _STD, *(_g(t, t, result=t) for t in (INT, UINT))),
    _fn("-_", _neg, _STD, _g(INT, result=INT), _g(DOUBLE, result=DOUBLE)),
    _fn("!_", _not, _STD, _g(BOOL, result=BOOL)),
    _fn("_<_", _ordering("_<_", lambda c: c < 0), _STD, *_cmp_overloads()),
    _fn("_<=_", _ordering("_<=_", lambda c: c <= 0), _STD, *_cmp_overloads()),
    _fn("_>_", _ordering("_>_", lambda c: c > 0), _STD, *_cmp_overloads()),
    _fn("_>=_", _ordering("_>=_", lambda c: c >= 0), _STD, *_cmp_overloads()),
    _fn("@in", _in, _STD, _g(A, list_of(A), result=BOOL), _g(A, map_of(A, B), result=BOOL)),
    # conversions and standard functions
    _fn("size", _size, _STD, *(o for t in (STRING, BYTES, list_of(A), map_of(A, B))
                                for o in (_g(t, result=INT), _m(t, result=INT)))),
    _fn("contains", _of_strings("contains", lambda s, sub: sub in s), _STD, _m(STRING, STRING, result=BOOL)),
    _fn("startsWith", _of_strings("startsWith", str.startswith), _STD, _m(STRING, STRING, result=BOOL)),
    _fn("endsWith", _of_strings("endsWith", str.endswith), _STD, _m(STRING, STRING, result=BOOL)),
    _fn("matches", _of_strings("matches", lambda s, p: regex.compile_pattern(p).search(s) is not None), _STD,
        _m(STRING, STRING, result=BOOL), _g(STRING, STRING, result=BOOL)),
    _fn("int", _to_int, _STD, *(_g(t, result=INT) for t in (INT, UINT, DOUBLE, STRING, DURATION, TIMESTAMP))),
    _fn("uint", _to_uint, _STD, *(_g(t, result=UINT) for t in (INT, UINT, DOUBLE, STRING))),
    _fn("double", _to_double, _STD, *(_g(t, result=DOUBLE) for t in (INT, UINT, DOUBLE, STRING))),
    _fn("string", _to_string, _STD, *(_g(t, result=STRING) for t in _STRINGABLE)),
    _fn("bytes", _to_bytes, _STD, _g(STRING, result=BYTES), _g(BYTES, result=BYTES)),
    _fn("bool", _to_bool, _STD, _g(BOOL, result=BOOL), _g(STRING, result=BOOL)),
    _fn("dyn", _dyn, _STD, _g(A, result=DYN)),
    _fn("type", _type, _STD, _g(A, result=TYPE)),
    # strings extension
    _fn("charAt", _char_at, _STRINGS, _m(STRING, INT, result=STRING)),
    _fn("indexOf", _index_finder(last=False), _STRINGS, _m(STRING, STRING, result=INT),
        _m(STRING, STRING, INT, result=INT), _m(list_of(A), A, result=INT)),
    _fn("lastIndexOf", _index_finder(last=True), _STRINGS, _m(STRING, STRING, result=INT),
        _m(STRING, STRING, INT, result=INT), _m(list_of(A), A, result=INT)),
    _fn("lowerAscii", _ascii_case(False), _STRINGS, _m(STRING, result=STRING)),
    _fn("upperAscii", _ascii_case(True), _STRINGS, _m(STRING, result=STRING)),
    _fn("replace", _replace, _STRINGS, _m(STRING, STRING, STRING, result=STRING),
        _m(STRING, STRING, STRING, INT, result=STRING)),
    _fn("split", _split, _STRINGS, _m(STRING, STRING, result=list_of(STRING)),
        _m(STRING, STRING, INT, result=list_of(STRING))),
    _fn("substring", _substring, _STRINGS, _m(STRING, INT, result=STRING), _m(STRING, INT, INT, result=STRING)),
    _fn("trim", _trim, _STRINGS, _m(STRING, result=STRING)),
    _fn("join", _join, _STRINGS, _m(list_of(STRING), result=STRING), _m(list_of(STRING), STRING, result=STRING)),
    _fn("strings.quote", _of_strings("strings.quote", quote), _STRINGS, _g(STRING, result=STRING)),
    _fn("format", _format, _STRINGS, _m(STRING, list_of(DYN), result=STRING)),
    # Kubernetes lists
    _fn("isSorted", _is_sorted, _LISTS_K8S, _m(list_of(A), result=BOOL)),
    _fn("sum", _sum, _LISTS_K8S, _m(list_of(A), result=A)),
    _fn("min", _extreme("min", -1), _LISTS_K8S, _m(list_of(A), result=A)),
    _fn("max", _extreme("max", 1), _LISTS_K8S, _m(list_of(A), result=A)),
    # lists extension
    _fn("slice", _slice, _LISTS_EXT, _m(list_of(A), INT, INT, result=list_of(A))),
    _fn("flatten", _flatten, _LISTS_EXT, _m(list_of(DYN), result=list_of(DYN)),
        _m(list_of(DYN), INT, result=list_of(DYN))),
    _fn("sort", _sort, _LISTS_EXT, _m(list_of(A), result=list_of(A))),
    _fn("lists.range", _range, _LISTS_EXT, _g(INT, result=list_of(INT))),
    _fn("reverse", _reverse, _LISTS_EXT, _m(list_of(A), result=list_of(A))),
    _fn("distinct", _distinct, _LISTS_EXT, _m(list_of(A), result=list_of(A))),
    # sets
    _fn("sets.contains", _sets_contains, _SETS, _g(list_of(A), list_of(A), result=BOOL)),
    _fn("sets.equivalent", _sets_equivalent, _SETS, _g(list_of(A), list_of(A), result=BOOL)),
    _fn("sets.intersects", _sets_intersects, _SETS, _g(list_of(A), list_of(A), result=BOOL)),
    # regex
    _fn("find", _find, _REGEX, _m(STRING, STRING, result=STRING)),
    _fn("findAll", _find_all, _REGEX, _m(STRING, STRING, result=list_of(STRING)),
        _m(STRING, STRING, INT, result=list_of(STRING))),
    # optional types
    _fn("optional.of", _optional_of, _OPTIONAL, _g(A, result=optional_of(A))),
    _fn("optional.ofNonZeroValue", _optional_of_non_zero, _OPTIONAL, _g(A, result=optional_of(A))),
    _fn("optional.none", _optional_none, _OPTIONAL, _g(result=optional_of(DYN))),
    _fn("hasValue", _has_value, _OPTIONAL, _m(optional_of(A), result=BOOL)),
    _fn("value", _value, _OPTIONAL, _m(optional_of(A), result=A)),
    _fn("orValue", _or_value, _OPTIONAL, _m(optional_of(A), A, result=A)),
    _fn("or", _or, _OPTIONAL, _m(optional_of(A), optional_of(A), result=optional_of(A))),
    _fn("first", _first, _OPTIONAL, _m(list_of(A), result=optional_of(A))),
    _fn("last", _last, _OPTIONAL, _m(list_of(A), result=optional_of(A))),
    _fn("optional.unwrap", _unwrap, _OPTIONAL, _g(list_of(optional_of(A)), result=list_of(A))),
    _fn("unwrapOpt", _unwrap, _OPTIONAL, _m(list_of(optional_of(A)), result=list_of(A))),
    # quantity
    _fn("quantity", _quantity, _QUANTITY, _g(STRING, result=QUANTITY)),
    _fn("isQuantity", _is_quantity, _QUANTITY, _g(STRING, result=BOOL)),
    _fn("sign", _sign, _QUANTITY, _m(QUANTITY, result=INT)),
    _fn("isInteger", _is_integer, _QUANTITY, _m(QUANTITY, result=BOOL)),
    _fn("asInteger", _as_integer, _QUANTITY, _m(QUANTITY, result=INT)),
    _fn("asApproximateFloat", _as_approximate_float, _QUANTITY, _m(QUANTITY, result=DOUBLE)),
    _fn("add", _quantity_arith("add"), _QUANTITY, _m(QUANTITY, QUANTITY, result=QUANTITY),
        _m(QUANTITY, INT, result=QUANTITY)),
    _fn("sub", _quantity_arith("sub"), _QUANTITY, _m(QUANTITY, QUANTITY, result=QUANTITY),
        _m(QUANTITY, INT, result=QUANTITY)),
    # shared by quantity and semver
    _fn("compareTo", _compare_to, _QUANTITY, _m(QUANTITY, QUANTITY, result=INT), _m(SEMVER, SEMVER, result=INT)),
    _fn("isGreaterThan", _is_greater_than, _QUANTITY, _m(QUANTITY, QUANTITY, result=BOOL),
        _m(SEMVER, SEMVER, result=BOOL)),
    _fn("isLessThan", _is_less_than, _QUANTITY, _m(QUANTITY, QUANTITY, result=BOOL),
        _m(SEMVER, SEMVER, result=BOOL)),
    # semver
    _fn("semver", _semver, _SEMVER, _g(STRING, result=SEMVER), _g(STRING, BOOL, result=SEMVER)),
    _fn("isSemver", _is_semver, _SEMVER, _g(STRING, result=BOOL), _g(STRING, BOOL, result=BOOL)),
    _fn("major", _component("major"), _SEMVER, _m(SEMVER, result=INT)),
    _fn("minor", _component("minor"), _SEMVER, _m(SEMVER, result=INT)),
    _fn("patch", _component("patch"), _SEMVER, _m(SEMVER, result=INT)),
    # DRA (1.36: list-typed attributes; Kubernetes lists v1 from 1.37)
    _fn("includes", _includes, _DRA, _m(DYN, DYN, result=BOOL)),
    # timestamps and durations
    _fn("timestamp", _timestamp, _TIME, *(_g(t, result=TIMESTAMP) for t in (TIMESTAMP, INT, STRING))),
    _fn("duration", _duration, _TIME, *(_g(t, result=DURATION) for t in (DURATION, INT, STRING))),
    *(_fn(g, _time_getter(g), _TIME, _m(TIMESTAMP, result=INT), _m(TIMESTAMP, STRING, result=INT),
          *((_m(DURATION, result=INT),) if g in _DURATION_GETTERS else ()))
      for g in _TS_GETTERS),
    # URLs
    _fn("url", _of_strings("url", netlib.parse_url), _URLS, _g(STRING, result=URL)),
    _fn("isURL", _of_strings("isURL", netlib.is_request_uri), _URLS, _g(STRING, result=BOOL)),
    _fn("getScheme", _method_of("getScheme", UrlValue, lambda u: u.scheme), _URLS, _m(URL, result=STRING)),
    _fn("getHost", _method_of("getHost", UrlValue, lambda u: u.host), _URLS, _m(URL, result=STRING)),
    _fn("getHostname", _method_of("getHostname", UrlValue, UrlValue.hostname), _URLS, _m(URL, result=STRING)),
    _fn("getPort", _method_of("getPort", UrlValue, UrlValue.port), _URLS, _m(URL, result=STRING)),
    _fn("getEscapedPath", _method_of("getEscapedPath", UrlValue, UrlValue.escaped_path), _URLS, _m(URL, result=STRING)),
    _fn("getQuery", _method_of("getQuery", UrlValue, UrlValue.query), _URLS,
        _m(URL, result=map_of(STRING, list_of(STRING)))),
    # IP addresses (`ip` is also <CIDR>.ip())
    _fn("ip", _ip, _IP, _g(STRING, result=IP), _m(CIDR, result=IP)),
    _fn("isIP", _of_strings("isIP", netlib.is_ip), _IP, _g(STRING, result=BOOL)),
    _fn("ip.isCanonical", _of_strings("ip.isCanonical", netlib.ip_is_canonical), _IP, _g(STRING, result=BOOL)),
    _fn("family", _method_of("family", IpValue, lambda ip: ip.version), _IP, _m(IP, result=INT)),
    _fn("isUnspecified", _method_of("isUnspecified", IpValue, IpValue.is_unspecified), _IP, _m(IP, result=BOOL)),
    _fn("isLoopback", _method_of("isLoopback", IpValue, IpValue.is_loopback), _IP, _m(IP, result=BOOL)),
    _fn("isLinkLocalMulticast", _method_of("isLinkLocalMulticast", IpValue, IpValue.is_link_local_multicast), _IP,
        _m(IP, result=BOOL)),
    _fn("isLinkLocalUnicast", _method_of("isLinkLocalUnicast", IpValue, IpValue.is_link_local_unicast), _IP,
        _m(IP, result=BOOL)),
    _fn("isGlobalUnicast", _method_of("isGlobalUnicast", IpValue, IpValue.is_global_unicast), _IP,
        _m(IP, result=BOOL)),
    # CIDRs
    _fn("cidr", _of_strings("cidr", netlib.parse_cidr), _CIDR, _g(STRING, result=CIDR)),
    _fn("isCIDR", _of_strings("isCIDR", netlib.is_cidr), _CIDR, _g(STRING, result=BOOL)),
    _fn("containsIP", _cidr_contains("containsIP", IpValue, netlib.parse_ip, CidrValue.contains_ip), _CIDR,
        _m(CIDR, STRING, result=BOOL), _m(CIDR, IP, result=BOOL)),
    _fn("containsCIDR", _cidr_contains("containsCIDR", CidrValue, netlib.parse_cidr, CidrValue.contains_cidr), _CIDR,
        _m(CIDR, STRING, result=BOOL), _m(CIDR, CIDR, result=BOOL)),
    _fn("prefixLength", _method_of("prefixLength", CidrValue, lambda c: c.prefix_length), _CIDR, _m(CIDR, result=INT)),
    _fn("masked", _method_of("masked", CidrValue, CidrValue.masked), _CIDR, _m(CIDR, result=CIDR)),
    # the format library
    _fn("format.named", _format_named, _FORMAT, _g(STRING, result=optional_of(FORMAT))),
    _fn("validate", _format_validate, _FORMAT, _m(FORMAT, STRING, result=optional_of(list_of(STRING)))),
    *(_fn(f"format.{key}", _constant_format(key), _FORMAT, _g(result=FORMAT)) for key in netlib.FORMATS),
)

FUNCTIONS: Final[Mapping[str, Function]] = {f.name: f for f in _FUNCTION_LIST}

# Names of CEL types usable as values (`type(x) == int`).
TYPE_IDENTIFIERS: Final[Mapping[str, CelTypeValue]] = {
    n: CelTypeValue(n)
    for n in ("int", "uint", "double", "bool", "string", "bytes", "list", "map", "null_type", "type",
              # qualified names: the standard library's types and those the IP and CIDR libraries declare
              "google.protobuf.Timestamp", "google.protobuf.Duration", "net.IP", "net.CIDR")
}


def to_cel_value(value: int | bool | str | Semver | Quantity) -> Any:
    """Convert one typed DRA value (attribute or capacity) to the value a selector sees."""
    return value
