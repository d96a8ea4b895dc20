"""Check a parsed selector (names, overloads, result type), estimate its worst-case cost, and turn it into a
Python closure (pure).

The checks are those of cel-go's checker as Kubernetes' DRA environment configures it
(`k8s.io/dynamic-resource-allocation/cel/compile.go`): undeclared names and functions, no matching overload
where the argument types are known, field selection on a type without fields, comprehension ranges that are
not lists or maps, homogeneous aggregate literals, constant regular expressions, and the result type
(bool or the attribute type). Attribute values are of an unknown type (`google.protobuf.Any`, `dyn` from
1.36), so most type errors in selectors surface at evaluation time, as upstream.

The cost estimate follows cel-go's `checker/cost.go` and the Kubernetes library cost estimator for the
constructs selectors use; see docs/allocator.md ("Cost").
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from dra_driver.cel import library, regex
from dra_driver.cel.library import FUNCTIONS, TYPE_IDENTIFIERS, Function
from dra_driver.cel.runtime import (
    _ABSENT,
    NONE,
    CelEvalError,
    CostLimitExceeded,
    Optional,
    cel_compare,
    cel_equal,
    go_type_name,
    map_lookup,
    type_name,
)
from dra_driver.cel.syntax import (
    Bind,
    Call,
    Comprehension,
    CreateList,
    CreateMap,
    Expr,
    Has,
    Ident,
    Index,
    Literal,
    OptMap,
    Select,
    UInt,
    children,
)
from dra_driver.cel.types import (
    BOOL,
    BYTES,
    DEVICE,
    DOUBLE,
    DYN,
    INT,
    NULL,
    QUANTITY,
    STRING,
    TYPE,
    UINT,
    CelType,
    assignable,
    list_of,
    map_of,
    optional_of,
    substitute,
)

__all__ = ["CompileIssue", "Compiled", "DeviceDeclaration", "compile_expression"]

Program = Callable[[dict[str, Any]], Any]

UNKNOWN_SIZE: Final = 2**64 - 1
COST_KEY: Final = "@cost"
# Sizes Kubernetes declares for the device variable (resource.k8s.io limits used by compile.go).
MAX_ATTRIBUTES: Final = 32  # ResourceSliceMaxAttributesAndCapacitiesPerDevice
MAX_DOMAIN: Final = 63  # DeviceMaxDomainLength
MAX_ID: Final = 32  # DeviceMaxIDLength
MAX_DRIVER: Final = 63  # DriverNameMaxLength
MAX_ATTRIBUTE_VALUE: Final = 64  # DeviceAttributeMaxValueLength (and ResourceSliceMaxAttributeValuesPerDevice)


@dataclass(frozen=True)
class CompileIssue(Exception):
    message: str
    offset: int


@dataclass(frozen=True)
class DeviceDeclaration:
    """What the environment declares: the device fields, the attribute type, and the functions."""

    allow_multiple_allocations: bool
    attribute_type: CelType  # ANY (<= 1.35) or DYN (1.36+, list-typed attributes)
    functions: frozenset[str]


@dataclass(frozen=True)
class Compiled:
    program: Program
    result_type: CelType
    max_cost: int  # worst-case estimate; UNKNOWN_SIZE when a size could not be bounded
    cost_known: bool


@dataclass(frozen=True)
class _Node:
    type: CelType
    cost: int
    size: int  # max size of a string/bytes/list/map value; UNKNOWN_SIZE when unbounded
    run: Program
    constant: object = _ABSENT  # the value, when the node is a literal


def _ceil(x: float) -> int:
    return math.ceil(x - 1e-9) if x > 0 else 0


def _sat(x: int) -> int:
    return min(x, UNKNOWN_SIZE)


class _Compiler:
    def __init__(self, decl: DeviceDeclaration, cost_limit: int) -> None:
        self.decl = decl
        self.cost_limit = cost_limit
        self.cost_known = True
        self.device_fields: dict[str, tuple[CelType, int]] = {
            "driver": (STRING, MAX_DRIVER),
            "attributes": (map_of(STRING, map_of(STRING, decl.attribute_type)), MAX_ATTRIBUTES),
            "capacity": (map_of(STRING, map_of(STRING, QUANTITY)), MAX_ATTRIBUTES),
        }
        if decl.allow_multiple_allocations:
            self.device_fields["allowMultipleAllocations"] = (BOOL, 1)

    # -- helpers ---------------------------------------------------------------------------------

    def size_of_elements(self, t: CelType, size_hint: int) -> int:
        """Max size of a value nested one level below a map/list whose element type is t."""
        if t == self.device_fields["attributes"][0].params[1]:
            return MAX_ATTRIBUTES
        if t.name == "map" and t.params and t.params[1] == QUANTITY:
            return MAX_ATTRIBUTES
        if t == self.decl.attribute_type:
            return MAX_ATTRIBUTE_VALUE
        return UNKNOWN_SIZE

    def unknown(self) -> int:
        self.cost_known = False
        return UNKNOWN_SIZE

    # -- dispatch --------------------------------------------------------------------------------

    def node(self, e: Expr, scope: Mapping[str, tuple[CelType, int]]) -> _Node:
        step = _STEPS.get(type(e))
        if step is None:
            raise CompileIssue(f"unsupported expression {type(e).__name__}", e.offset)
        return step(self, e, scope)

    def literal(self, e: Literal) -> _Node:
        v = e.value
        t = _LITERAL_TYPES.get(type(v), NULL)
        size = len(v) if isinstance(v, str | bytes) else 0
        return _Node(t, 0, size, lambda act: v, v)

    def ident(self, e: Ident, scope: Mapping[str, tuple[CelType, int]]) -> _Node:
        name = e.name
        if name in scope:
            t, size = scope[name]
            return _Node(t, 1, size, lambda act: act[name])
        if name == "device":
            return _Node(DEVICE, 1, 0, lambda act: act["device"])
        if name in TYPE_IDENTIFIERS:
            value = TYPE_IDENTIFIERS[name]
            return _Node(TYPE, 1, 0, lambda act: value)
        raise CompileIssue(f"undeclared reference to '{name}' (in container '')", e.offset)

    def select(self, e: Select, scope: Mapping[str, tuple[CelType, int]]) -> _Node:
        qualified = _qualified_name(e)
        if qualified is not None and qualified.split(".", 1)[0] not in scope and qualified in TYPE_IDENTIFIERS:
            type_value = TYPE_IDENTIFIERS[qualified]  # `net.IP`, `google.protobuf.Timestamp`
            return _Node(TYPE, 1, 0, lambda act: type_value)
        operand = self.node(e.operand, scope)
        field = e.field
        t = operand.type
        optional = e.optional or t.name == "optional_type"
        base = t.params[0] if t.name == "optional_type" and t.params else t
        if base == DEVICE:
            if field not in self.device_fields:
                raise CompileIssue(f"undefined field '{field}'", e.offset)
            result_type, size = self.device_fields[field]
        elif base.name == "map":
            result_type = base.params[1] if base.params else DYN
            size = self.size_of_elements(result_type, operand.size)
        elif base.is_dyn:
            result_type, size = DYN, UNKNOWN_SIZE
        else:
            raise CompileIssue(f"type '{base}' does not support field selection", e.offset)
        if result_type == self.decl.attribute_type and base.name == "map":
            size = MAX_ATTRIBUTE_VALUE
        run_operand = operand.run
        if optional:
            def run_optional(act: dict[str, Any]) -> Any:
                value = _unwrapped(run_operand(act))
                return NONE if value is _ABSENT else _optional_field(value, field)

            return _Node(optional_of(result_type), operand.cost + 1, size, run_optional)

        def run(act: dict[str, Any]) -> Any:
            return _field(run_operand(act), field)

        return _Node(result_type, operand.cost + 1, size, run)

    def index(self, e: Index, scope: Mapping[str, tuple[CelType, int]]) -> _Node:
        operand = self.node(e.operand, scope)
        idx = self.node(e.index, scope)
        t = operand.type
        optional = e.optional or t.name == "optional_type"
        base = t.params[0] if t.name == "optional_type" and t.params else t
        if base.name == "list":
            if not (idx.type.is_dyn or idx.type in (INT, UINT, DOUBLE)):
                raise _no_overload("_[_]", [base, idx.type], False, e.offset)
            result_type = base.params[0] if base.params else DYN
        elif base.name == "map":
            result_type = base.params[1] if base.params else DYN
        elif base.is_dyn:
            result_type = DYN
        else:
            raise _no_overload("_[_]", [base, idx.type], False, e.offset)
        size = self.size_of_elements(result_type, operand.size)
        if result_type == self.decl.attribute_type:
            size = MAX_ATTRIBUTE_VALUE
        run_operand, run_index = operand.run, idx.run
        cost = operand.cost + idx.cost + 1
        if optional:
            def run_optional(act: dict[str, Any]) -> Any:
                value = _unwrapped(run_operand(act))
                return NONE if value is _ABSENT else _optional_index(value, run_index(act))

            return _Node(optional_of(result_type), cost, size, run_optional)

        def run(act: dict[str, Any]) -> Any:
            return _index(run_operand(act), run_index(act))

        return _Node(result_type, cost, size, run)

    def has(self, e: Has, scope: Mapping[str, tuple[CelType, int]]) -> _Node:
        operand = self.node(e.operand, scope)
        base = operand.type
        field = e.field
        if base == DEVICE:
            if field not in self.device_fields:
                raise CompileIssue(f"undefined field '{field}'", e.offset)
        elif not (base.name == "map" or base.is_dyn):
            raise CompileIssue(f"type '{base}' does not support field selection", e.offset)
        run_operand = operand.run

        def run(act: dict[str, Any]) -> bool:
            value = run_operand(act)
            if isinstance(value, Mapping):
                return value.get(field, _ABSENT) is not _ABSENT if isinstance(value, dict) else field in value
            raise CelEvalError(f"invalid type for field selection: {type_name(value)}")

        # Kubernetes sets PresenceTestHasCost(false): has() itself costs nothing.
        return _Node(BOOL, operand.cost, 0, run)

    # -- calls -----------------------------------------------------------------------------------

    def call(self, e: Call, scope: Mapping[str, tuple[CelType, int]]) -> _Node:
        name = e.function
        target = e.target
        # Namespaced functions (sets.contains, strings.quote, optional.of, lists.range) parse as member calls
        # on an identifier; they are global functions unless the identifier is a variable in scope.
        if isinstance(target, Ident) and target.name not in scope and f"{target.name}.{name}" in FUNCTIONS:
            name = f"{target.name}.{name}"
            target = None
        if name in ("_&&_", "_||_"):
            return self.logical(e, scope)
        if name == "_?_:_":
            return self.conditional(e, scope)
        if name in ("_==_", "_!=_"):
            return self.equality(e, name, scope)
        fn = FUNCTIONS.get(name)
        if fn is None or name not in self.decl.functions:
            raise CompileIssue(f"undeclared reference to '{name}' (in container '')", e.offset)
        args = [self.node(a, scope) for a in e.args]
        target_node = self.node(target, scope) if target is not None else None
        arg_types = [a.type for a in args]
        result_type = self.resolve(fn, target_node.type if target_node else None, arg_types, e.offset)
        all_nodes = ([target_node] if target_node else []) + args
        self.check_constant_regex(name, all_nodes, e)
        self.check_constant_time(name, fn, all_nodes, e)
        cost = sum(n.cost for n in all_nodes) + self.call_cost(name, all_nodes)
        size = self.result_size(name, all_nodes)
        impl = fn.impl
        runs = [n.run for n in all_nodes]
        return _Node(result_type, _sat(cost), size, _call_closure(impl, runs))

    def resolve(self, fn: Function, target: CelType | None, args: list[CelType], offset: int) -> CelType:
        member = target is not None
        full = ([target] if target is not None else []) + args
        matches: list[CelType] = []
        for overload in fn.overloads:
            if overload.member != member or len(overload.params) != len(full):
                continue
            bindings: dict[str, CelType] = {}
            if all(assignable(p, a, bindings) for p, a in zip(overload.params, full, strict=True)):
                matches.append(substitute(overload.result, bindings))
        if not matches:
            raise _no_overload(fn.name, full, member, offset)
        first = matches[0]
        return first if all(m == first for m in matches) else DYN

    def check_constant_regex(self, name: str, nodes: list[_Node], e: Call) -> None:
        # cel.ValidateRegexLiterals (Kubernetes base environment, 1.29+)
        if name in ("matches", "find", "findAll") and len(nodes) >= 2:
            pattern = nodes[1].constant
            if isinstance(pattern, str):
                problem = regex.pattern_error(pattern)
                if problem is not None:
                    raise CompileIssue(f"invalid matches argument: error parsing regexp: {problem}", e.offset)

    def check_constant_time(self, name: str, fn: Function, nodes: list[_Node], e: Call) -> None:
        # cel.ValidateDurationLiterals / ValidateTimestampLiterals (Kubernetes base environment, 1.29+)
        if name in ("duration", "timestamp") and len(nodes) == 1 and nodes[0].constant is not _ABSENT:
            try:
                fn.impl(nodes[0].constant)
            except CelEvalError:
                raise CompileIssue(f"invalid {name} argument", e.args[0].offset) from None

    def call_cost(self, name: str, nodes: list[_Node]) -> int:
        sizes = [n.size for n in nodes]

        def traverse(size: int, factor: float = 0.1) -> int:
            if size >= UNKNOWN_SIZE:
                return self.unknown()
            return _ceil(size * factor)

        if name == "matches" or name in ("find", "findAll"):
            return _sat(traverse(sizes[0]) * max(traverse(sizes[1], 0.25), 1))
        if name == "split":
            return traverse(sizes[0], 0.2)
        if name in ("_+_",) and nodes[0].type in (STRING, BYTES):
            return traverse(_sat(sizes[0] + sizes[1]))
        if name in ("contains", "startsWith", "endsWith", "lowerAscii", "upperAscii", "trim", "replace",
                    "indexOf", "lastIndexOf", "substring", "charAt", "join", "strings.quote", "format",
                    "quantity", "isQuantity", "semver", "isSemver"):
            if (nodes and nodes[0].type in (STRING, BYTES)) or (nodes and nodes[0].type.name == "list"):
                return max(traverse(sizes[0]), 1)
            return 1
        # The Kubernetes library cost estimator (library/cost.go). `cidr`, `isIP`, `isCIDR`, `ip` and
        # `ip.isCanonical` are global calls that its estimator guards with `target != nil`, so cel-go's
        # default of 1 applies to them; the accessors are nominal.
        if name == "url":
            return traverse(sizes[0])
        if name in ("containsIP", "containsCIDR"):
            # compare two 4..16-byte addresses: ceil((16 + 16) * 0.1); containsCIDR masks too: + ceil(16 * 0.1) + 1
            fixed = 4 if name == "containsIP" else 4 + 2 + 1
            return fixed + (traverse(sizes[1]) if nodes[1].type == STRING else 0)
        if name == "includes":
            return library.MAX_INCLUDES_LIST  # DRA's estimate: ResourceSliceMaxAttributeValuesPerDevice
        if (name in ("@in",) and nodes[1].type.name == "list") or (name in ("@in",) and nodes[1].type.is_dyn):
            return traverse(sizes[1], 1.0) if nodes[1].size < UNKNOWN_SIZE else self.unknown()
        if name in ("isSorted", "sum", "min", "max", "sort", "reverse", "distinct", "flatten", "slice",
                    "sets.contains", "sets.equivalent", "sets.intersects"):
            total = sum(sizes) if all(s < UNKNOWN_SIZE for s in sizes) else self.unknown()
            return max(_sat(total), 1)
        return 1

    def result_size(self, name: str, nodes: list[_Node]) -> int:
        sizes = [n.size for n in nodes]
        if name in ("lowerAscii", "upperAscii", "trim", "substring", "reverse", "sort", "distinct", "slice"):
            return sizes[0]
        if name in ("split",):
            return sizes[0] + 1 if sizes[0] < UNKNOWN_SIZE else UNKNOWN_SIZE
        if name == "charAt":
            return 1
        if name == "_+_":
            return _sat(sizes[0] + sizes[1]) if len(sizes) == 2 else UNKNOWN_SIZE
        if name in ("findAll",):
            return sizes[0]
        if name in ("find",):
            return sizes[0]
        if name in ("string", "format", "join", "replace", "strings.quote", "lists.range", "flatten", "getScheme",
                    "getHost", "getHostname", "getPort", "getEscapedPath", "getQuery"):
            return UNKNOWN_SIZE
        return 0

    def logical(self, e: Call, scope: Mapping[str, tuple[CelType, int]]) -> _Node:
        left, right = (self.node(a, scope) for a in e.args)
        for n in (left, right):
            if not (n.type == BOOL or n.type.is_dyn):
                raise _no_overload(e.function, [left.type, right.type], False, e.offset)
        lrun, rrun = left.run, right.run
        is_and = e.function == "_&&_"

        def run(act: dict[str, Any]) -> Any:
            # CEL's commutative logic: a false (true) side decides an && (||) even if the other side errs.
            try:
                lv = lrun(act)
            except CostLimitExceeded:
                raise
            except CelEvalError as err:
                lerr: CelEvalError | None = err
                lv = None
            else:
                lerr = None
                if lv is (not is_and):
                    return lv
                if not isinstance(lv, bool):
                    lerr = _bool_expected(e.function, lv)
            rv = rrun(act)
            if rv is (not is_and):
                return rv
            if not isinstance(rv, bool):
                raise lerr or _bool_expected(e.function, rv)
            if lerr is not None:
                raise lerr
            return rv

        return _Node(BOOL, _sat(left.cost + right.cost), 0, run)

    def conditional(self, e: Call, scope: Mapping[str, tuple[CelType, int]]) -> _Node:
        cond, yes, no = (self.node(a, scope) for a in e.args)
        if not (cond.type == BOOL or cond.type.is_dyn):
            raise _no_overload("_?_:_", [cond.type, yes.type, no.type], False, e.offset)
        if yes.type == no.type:
            t = yes.type
        elif assignable(yes.type, no.type, {}) or assignable(no.type, yes.type, {}) or NULL in (yes.type, no.type):
            t = DYN if yes.type.is_dyn or no.type.is_dyn else (yes.type if _more_specific(yes.type) else no.type)
        else:
            raise _no_overload("_?_:_", [cond.type, yes.type, no.type], False, e.offset)
        c, y, n = cond.run, yes.run, no.run

        def run(act: dict[str, Any]) -> Any:
            v = c(act)
            if v is True:
                return y(act)
            if v is False:
                return n(act)
            raise CelEvalError(f"no such overload: _?_:_({type_name(v)}, ...)")

        return _Node(t, _sat(cond.cost + max(yes.cost, no.cost)), max(yes.size, no.size), run)

    def equality(self, e: Call, name: str, scope: Mapping[str, tuple[CelType, int]]) -> _Node:
        left, right = (self.node(a, scope) for a in e.args)
        lt, rt = left.type, right.type
        if not _comparable_for_equality(lt, rt):
            raise _no_overload(name, [lt, rt], False, e.offset)
        if lt in (STRING, BYTES) or rt in (STRING, BYTES):
            low = min(left.size, right.size)
            call = _ceil(low * 0.1) if low < UNKNOWN_SIZE else self.unknown()
        else:
            call = 1
        lrun, rrun = left.run, right.run
        equal = library_equal
        if name == "_==_":
            def run(act: dict[str, Any]) -> bool:
                return equal(lrun(act), rrun(act))
        else:
            def run(act: dict[str, Any]) -> bool:
                return not equal(lrun(act), rrun(act))

        return _Node(BOOL, _sat(left.cost + right.cost + call), 0, run)

    # -- literals --------------------------------------------------------------------------------

    def create_list(self, e: CreateList, scope: Mapping[str, tuple[CelType, int]]) -> _Node:
        elements = [self.node(x, scope) for x in e.elements]
        elem_types = []
        for i, n in enumerate(elements):
            t = n.type
            if i in e.optional_indices:
                if t.name != "optional_type" and not t.is_dyn:
                    raise CompileIssue(f"expected type 'optional_type({t})' but found '{t}'", e.elements[i].offset)
                t = t.params[0] if t.params else DYN
            elem_types.append(t)
        elem = _homogeneous(elem_types, e.elements)
        runs = [n.run for n in elements]
        optional = e.optional_indices
        if optional:
            def run(act: dict[str, Any]) -> Any:
                out = []
                for i, r in enumerate(runs):
                    v = r(act)
                    if i in optional:
                        if not isinstance(v, Optional):
                            raise CelEvalError(f"cannot initialize optional list element from non-optional value {v}")
                        if v.present:
                            out.append(v.value)
                    else:
                        out.append(v)
                return out
        elif all(n.constant is not _ABSENT for n in elements):
            value = [n.constant for n in elements]

            def run(act: dict[str, Any]) -> Any:
                return value
        else:
            def run(act: dict[str, Any]) -> Any:
                return [r(act) for r in runs]

        return _Node(list_of(elem), _sat(10 + sum(n.cost for n in elements)), len(elements), run)

    def create_map(self, e: CreateMap, scope: Mapping[str, tuple[CelType, int]]) -> _Node:
        keys = [self.node(k, scope) for k, _, _ in e.entries]
        values = [self.node(v, scope) for _, v, _ in e.entries]
        for k in keys:
            if not (k.type in (INT, UINT, BOOL, STRING) or k.type.is_dyn):
                raise CompileIssue(f"unsupported map key type: {k.type}", e.offset)
        value_types = []
        for (_, vexpr, opt), v in zip(e.entries, values, strict=True):
            t = v.type
            if opt:
                if t.name != "optional_type" and not t.is_dyn:
                    raise CompileIssue(f"expected type 'optional_type({t})' but found '{t}'", vexpr.offset)
                t = t.params[0] if t.params else DYN
            value_types.append(t)
        key_type = _homogeneous([k.type for k in keys], [k for k, _, _ in e.entries])
        value_type = _homogeneous(value_types, [v for _, v, _ in e.entries])
        entries = [(k.run, v.run, opt) for k, v, (_, _, opt) in zip(keys, values, e.entries, strict=True)]

        def run(act: dict[str, Any]) -> Any:
            out: dict[Any, Any] = {}
            for krun, vrun, opt in entries:
                key = krun(act)
                if not isinstance(key, str | int) or isinstance(key, float):
                    raise CelEvalError(f"unsupported key type: {type_name(key)}")
                value = vrun(act)
                if opt:
                    if not isinstance(value, Optional):
                        raise CelEvalError("cannot initialize optional entry from non-optional value")
                    if not value.present:
                        continue
                    value = value.value
                if map_lookup(out, key) is not _ABSENT:
                    raise CelEvalError(f"Failed with repeated key: {library.format_value(key)}")
                out[key] = value
            return out

        cost = 30 + sum(k.cost + v.cost for k, v in zip(keys, values, strict=True))
        return _Node(map_of(key_type, value_type), _sat(cost), len(keys), run)

    # -- macros ----------------------------------------------------------------------------------

    def bind(self, e: Bind, scope: Mapping[str, tuple[CelType, int]]) -> _Node:
        init = self.node(e.init, scope)
        body = self.node(e.body, {**scope, e.var: (init.type, init.size)})
        var, irun, brun = e.var, init.run, body.run

        def run(act: dict[str, Any]) -> Any:
            saved = act.get(var, _ABSENT)
            act[var] = irun(act)
            try:
                return brun(act)
            finally:
                if saved is _ABSENT:
                    del act[var]
                else:
                    act[var] = saved

        # cel.bind is a comprehension over an empty list: list creation (10) + init + result.
        return _Node(body.type, _sat(10 + init.cost + body.cost), body.size, run)

    def opt_map(self, e: OptMap, scope: Mapping[str, tuple[CelType, int]]) -> _Node:
        operand = self.node(e.operand, scope)
        t = operand.type
        if not (t.name == "optional_type" or t.is_dyn):
            raise _no_overload("optMap" if not e.flat else "optFlatMap", [t], True, e.offset)
        elem = t.params[0] if t.params else DYN
        body = self.node(e.body, {**scope, e.var: (elem, operand.size)})
        result = body.type if e.flat else optional_of(body.type)
        var, orun, brun, flat = e.var, operand.run, body.run, e.flat

        def run(act: dict[str, Any]) -> Any:
            value = orun(act)
            if not isinstance(value, Optional):
                raise CelEvalError(f"no such overload: optMap({type_name(value)})")
            if not value.present:
                return NONE
            saved = act.get(var, _ABSENT)
            act[var] = value.value
            try:
                out = brun(act)
            finally:
                if saved is _ABSENT:
                    del act[var]
                else:
                    act[var] = saved
            if flat:
                if not isinstance(out, Optional):
                    raise CelEvalError("optFlatMap() body must return an optional value")
                return out
            return Optional(True, out)

        return _Node(result, _sat(operand.cost + body.cost + 12), body.size, run)

    def comprehension(self, e: Comprehension, scope: Mapping[str, tuple[CelType, int]]) -> _Node:
        if e.kind == "sortBy" and "sortBy" not in self.decl.functions:
            raise CompileIssue("undeclared reference to 'sortBy' (in container '')", e.offset)
        rng = self.node(e.range_, scope)
        rt = rng.type
        if not (rt.name in ("list", "map") or rt.is_dyn):
            raise CompileIssue(
                f"expression of type '{rt}' cannot be range of a comprehension (must be list, map, or dynamic)",
                e.range_.offset,
            )
        two = e.var2 is not None
        if rt.name == "list":
            first_t = INT if two else (rt.params[0] if rt.params else DYN)
            second_t = rt.params[0] if rt.params else DYN
        elif rt.name == "map":
            first_t = rt.params[0] if rt.params else DYN
            second_t = rt.params[1] if rt.params else DYN
        else:
            first_t = second_t = DYN
        elem_size = self.size_of_elements(second_t, rng.size) if not two or rt.name == "map" else UNKNOWN_SIZE
        if rt.name == "map" and not two:
            # keys: attribute/capacity ids of a domain map, domains of device.attributes/capacity
            domain_map = self.device_fields["attributes"][0].params[1]
            inner_map = rt == domain_map or bool(rt.params and rt.params[1] == QUANTITY)
            elem_size = MAX_ID if inner_map else (MAX_DOMAIN if rng.size == MAX_ATTRIBUTES else UNKNOWN_SIZE)
        inner: dict[str, tuple[CelType, int]] = dict(scope)
        if two:
            inner[e.var] = (first_t, MAX_ID if rt.name == "map" else 0)
            assert e.var2 is not None
            inner[e.var2] = (second_t, elem_size)
        else:
            inner[e.var] = (first_t, elem_size)
        pred = self.node(e.predicate, inner) if e.predicate is not None else None
        trans = self.node(e.transform, inner) if e.transform is not None else None
        transforms = ("map", "transformList", "transformMap", "transformMapEntry")
        if pred is not None and e.kind not in transforms and not (pred.type == BOOL or pred.type.is_dyn):
            raise _no_overload("_&&_" if e.kind.startswith("all") else "_||_", [BOOL, pred.type], False,
                               e.predicate.offset if e.predicate else e.offset)
        kind = e.kind
        p_cost = pred.cost if pred else 0
        t_cost = trans.cost if trans else 0
        if kind in ("all", "all2"):
            per_iter, fixed, result_t = 2 + 1 + p_cost, 1, BOOL
        elif kind in ("exists", "exists2"):
            per_iter, fixed, result_t = 3 + 1 + p_cost, 1, BOOL
        elif kind in ("exists_one", "existsOne2"):
            per_iter, fixed, result_t = p_cost + 2, 2, BOOL
        elif kind in ("map", "transformList"):
            step = 12 + t_cost
            per_iter = p_cost + step if pred else step
            fixed, result_t = 11, list_of(trans.type if trans else DYN)
        elif kind == "filter":
            per_iter, fixed, result_t = p_cost + 13, 11, list_of(second_t if rt.name == "list" else first_t)
        elif kind == "transformMap":
            per_iter = p_cost + t_cost + 3
            fixed, result_t = 31, map_of(first_t, trans.type if trans else DYN)
        elif kind == "transformMapEntry":
            per_iter = p_cost + t_cost + 3
            tt = trans.type if trans else DYN
            fixed, result_t = 31, tt if tt.name == "map" else map_of(DYN, DYN)
        elif kind == "sortBy":
            per_iter, fixed = t_cost + 13, 11 + 1
            result_t = rt if rt.name == "list" else list_of(DYN)
        else:
            raise CompileIssue(f"unknown macro {kind}", e.offset)
        iterations = self.unknown() if rng.size >= UNKNOWN_SIZE else rng.size
        cost = _sat(rng.cost + fixed + iterations * per_iter)
        result_size = rng.size if result_t.name in ("list", "map") else 0
        # At run time each iteration is charged by the size of its body, not by the worst-case estimate
        # (cel-go tracks actual costs): a bounded stand-in that still stops runaway nested loops.
        charge = 2 + _count_nodes(e.predicate) + _count_nodes(e.transform)
        run = _comprehension_closure(kind, rng.run, e.var, e.var2, pred.run if pred else None,
                                     trans.run if trans else None, charge, self.cost_limit)
        return _Node(result_t, cost, result_size, run)


_Scope = Mapping[str, tuple[CelType, int]]

# The type of a literal by the parser's Python type of its value (null's is None).
_LITERAL_TYPES: Final[Mapping[type, CelType]] = {
    bool: BOOL, UInt: UINT, int: INT, float: DOUBLE, str: STRING, bytes: BYTES,
}

# How each kind of expression compiles.
_STEPS: Final[Mapping[type[Expr], Callable[[_Compiler, Any, _Scope], _Node]]] = {
    Literal: lambda compiler, e, scope: compiler.literal(e),
    Ident: _Compiler.ident,
    Select: _Compiler.select,
    Index: _Compiler.index,
    Has: _Compiler.has,
    Call: _Compiler.call,
    CreateList: _Compiler.create_list,
    CreateMap: _Compiler.create_map,
    Bind: _Compiler.bind,
    Comprehension: _Compiler.comprehension,
    OptMap: _Compiler.opt_map,
}


library_equal: Final = cel_equal


def _qualified_name(e: Expr) -> str | None:
    """`a.b.c` as written, when the expression is only identifiers and field selections."""
    parts: list[str] = []
    while isinstance(e, Select) and not e.optional:
        parts.append(e.field)
        e = e.operand
    if not isinstance(e, Ident):
        return None
    parts.append(e.name)
    return ".".join(reversed(parts))


def _more_specific(t: CelType) -> bool:
    return not any(p.is_dyn for p in t.params)


def _count_nodes(e: Expr | None) -> int:
    if e is None:
        return 0
    count = 0
    stack: list[Expr] = [e]
    while stack:
        node = stack.pop()
        count += 1
        stack.extend(children(node))
    return count


def _comparable_for_equality(a: CelType, b: CelType) -> bool:
    if a.is_dyn or b.is_dyn or a == b:
        return True
    numeric = (INT, UINT, DOUBLE)
    if a in numeric and b in numeric:
        return True  # CrossTypeNumericComparisons (1.28+)
    if NULL in (a, b):
        return True
    if a.name == b.name and a.params and b.params:
        return all(_comparable_for_equality(x, y) for x, y in zip(a.params, b.params, strict=True))
    return False


def _homogeneous(types: Sequence[CelType], exprs: Sequence[Expr]) -> CelType:
    """cel.HomogeneousAggregateLiterals: all elements of a literal share one type (dyn() opts out)."""
    known: CelType | None = None
    for t, x in zip(types, exprs, strict=True):
        if t.is_dyn:
            continue
        if known is None:
            known = t
        elif t != known:
            raise CompileIssue(f"expected type '{known}' but found '{t}'", x.offset)
    if known is None:
        return DYN
    return DYN if any(t.is_dyn for t in types) else known


def _no_overload(name: str, types: Sequence[CelType], member: bool, offset: int) -> CompileIssue:
    if member and types:
        shown = f"{types[0]}.({', '.join(str(t) for t in types[1:])})"
    else:
        shown = f"({', '.join(str(t) for t in types)})"
    return CompileIssue(f"found no matching overload for '{name}' applied to '{shown}'", offset)


def _bool_expected(name: str, value: object) -> CelEvalError:
    return CelEvalError(f"no such overload: {name}({type_name(value)})")


def _call_closure(impl: Callable[..., Any], runs: list[Program]) -> Program:
    if len(runs) == 0:
        return lambda act: impl()
    if len(runs) == 1:
        (r0,) = runs
        return lambda act: impl(r0(act))
    if len(runs) == 2:
        r0, r1 = runs
        return lambda act: impl(r0(act), r1(act))
    if len(runs) == 3:
        r0, r1, r2 = runs
        return lambda act: impl(r0(act), r1(act), r2(act))
    return lambda act: impl(*(r(act) for r in runs))


# -- field access at run time --------------------------------------------------------------------


def _field(value: Any, name: str) -> Any:
    if isinstance(value, dict):
        try:
            return value[name]
        except KeyError:
            raise CelEvalError(f"no such key: {name}") from None
    if isinstance(value, Mapping):
        if name in value:
            return value[name]
        raise CelEvalError(f"no such key: {name}")
    raise CelEvalError(f"type '{type_name(value)}' does not support field selection")


def _unwrapped(value: Any) -> Any:
    """`a.?b`, `a[?i]` on an optional: its value, or _ABSENT when empty; any other operand as it is."""
    if isinstance(value, Optional):
        return value.value if value.present else _ABSENT
    return value


def _optional_field(value: Any, name: str) -> Optional:
    if isinstance(value, Mapping):
        if isinstance(value, DomainMap):
            return Optional(True, value[name])
        found = value.get(name, _ABSENT)
        return NONE if found is _ABSENT else Optional(True, found)
    raise CelEvalError(f"type '{type_name(value)}' does not support field selection")


def _list_position(items: Sequence[Any], index: Any) -> int:
    if isinstance(index, bool):
        raise CelEvalError("unsupported index type 'bool' in list")
    if isinstance(index, float):
        if not index.is_integer():
            raise CelEvalError(f"unsupported index value {index} in list")
        index = int(index)
    if not isinstance(index, int):
        raise CelEvalError(f"unsupported index type '{type_name(index)}' in list")
    return int(index)


def _index(value: Any, index: Any) -> Any:
    if isinstance(value, dict) and isinstance(index, str):
        try:
            return value[index]
        except KeyError:
            raise CelEvalError(f"no such key: {index}") from None
    if isinstance(value, Mapping):
        found = map_lookup(value, index)
        if found is _ABSENT:
            if isinstance(value, DomainMap):
                return value[index]
            raise CelEvalError(f"no such key: {library.format_value(index)}")
        return found
    if isinstance(value, list | tuple):
        i = _list_position(value, index)
        if i < 0 or i >= len(value):
            raise CelEvalError(f"index out of bounds: {i}")
        return value[i]
    raise CelEvalError(f"no such overload: _[_]({type_name(value)}, {type_name(index)})")


def _optional_index(value: Any, index: Any) -> Optional:
    if isinstance(value, Mapping):
        if isinstance(value, DomainMap):
            return Optional(True, value[index])
        found = map_lookup(value, index)
        return NONE if found is _ABSENT else Optional(True, found)
    if isinstance(value, list | tuple):
        i = _list_position(value, index)
        return Optional(True, value[i]) if 0 <= i < len(value) else NONE
    raise CelEvalError(f"no such overload: _[?_]({type_name(value)}, {type_name(index)})")


class DomainMap(dict[str, Any]):
    """domain -> (id -> value); an unknown domain reads as an empty map, as Kubernetes' DRA `mapper.Find`."""

    def __missing__(self, key: str) -> Any:
        return {}


# -- comprehensions at run time ------------------------------------------------------------------


def _iterate(value: Any, two: bool) -> Iterator[tuple[Any, Any]]:
    if isinstance(value, list | tuple):
        if two:
            return iter(enumerate(value))
        return ((v, None) for v in value)
    if isinstance(value, Mapping):
        if two:
            return iter(value.items())
        return ((k, None) for k in value)
    raise CelEvalError(f"got '{go_type_name(value)}', expected iterable type")


def _comprehension_closure(
    kind: str,
    range_run: Program,
    var: str,
    var2: str | None,
    pred: Program | None,
    trans: Program | None,
    per_iteration: int,
    cost_limit: int,
) -> Program:
    two = var2 is not None

    def charge(act: dict[str, Any]) -> None:
        counter = act[COST_KEY]
        counter[0] += per_iteration
        if counter[0] > cost_limit:
            raise CostLimitExceeded("operation cancelled: actual cost limit exceeded")

    def run(act: dict[str, Any]) -> Any:
        items = _iterate(range_run(act), two)
        saved = act.get(var, _ABSENT)
        saved2 = act.get(var2, _ABSENT) if var2 is not None else _ABSENT
        try:
            return loop(act, items)
        finally:
            for name, old in ((var, saved), (var2, saved2)):
                if name is None:
                    continue
                if old is _ABSENT:
                    act.pop(name, None)
                else:
                    act[name] = old

    def bind(act: dict[str, Any], first: Any, second: Any) -> None:
        act[var] = first
        if var2 is not None:
            act[var2] = second

    def steps(act: dict[str, Any], items: Iterator[tuple[Any, Any]]) -> Iterator[tuple[Any, Any]]:
        """Each item, charged and bound to the loop's variables."""
        for first, second in items:
            charge(act)
            bind(act, first, second)
            yield first, second

    def kept(act: dict[str, Any]) -> bool:
        """A filter's predicate on the bound item (no predicate keeps every item)."""
        if pred is None:
            return True
        keep = pred(act)
        if not isinstance(keep, bool):
            raise _bool_expected("_?_:_", keep)
        return keep

    def loop(act: dict[str, Any], items: Iterator[tuple[Any, Any]]) -> Any:
        if kind in ("all", "all2", "exists", "exists2"):
            decisive = kind.startswith("exists")
            error: CelEvalError | None = None
            assert pred is not None
            for _ in steps(act, items):
                try:
                    v = pred(act)
                except CostLimitExceeded:
                    raise
                except CelEvalError as err:
                    error = error or err
                    continue
                if v is decisive:
                    return decisive
                if not isinstance(v, bool):
                    error = error or _bool_expected("_&&_" if not decisive else "_||_", v)
            if error is not None:
                raise error
            return not decisive
        if kind in ("exists_one", "existsOne2"):
            assert pred is not None
            count = 0
            for _ in steps(act, items):
                v = pred(act)
                if v is True:
                    count += 1
                elif v is not False:
                    raise _bool_expected("_?_:_", v)
            return count == 1
        if kind in ("map", "transformList", "filter"):
            out: list[Any] = []
            for first, second in steps(act, items):
                if not kept(act):
                    continue
                if kind == "filter":
                    out.append(second if two else first)
                else:
                    assert trans is not None
                    out.append(trans(act))
            return out
        if kind in ("transformMap", "transformMapEntry"):
            result: dict[Any, Any] = {}
            for first, _ in steps(act, items):
                if not kept(act):
                    continue
                assert trans is not None
                value = trans(act)
                if kind == "transformMap":
                    result[first] = value
                else:
                    if not isinstance(value, Mapping):
                        raise CelEvalError("transformMapEntry() expression must return a map")
                    for k, v in value.items():
                        if map_lookup(result, k) is not _ABSENT:
                            raise CelEvalError(f"insert failed: key {library.format_value(k)} already exists")
                        result[k] = v
            return result
        if kind == "sortBy":
            assert trans is not None
            pairs: list[tuple[Any, Any]] = []
            for first, _ in items:
                charge(act)
                bind(act, first, None)
                pairs.append((trans(act), first))
            keys = [k for k, _ in pairs]
            if len({type_name(k) for k in keys}) > 1:
                raise CelEvalError("list elements must have the same type")
            def by_key(i: int, j: int) -> int:
                return cel_compare("sortBy", pairs[i][0], pairs[j][0])

            order = sorted(range(len(pairs)), key=functools.cmp_to_key(by_key))
            return [pairs[i][1] for i in order]
        raise CelEvalError(f"unknown macro {kind}")

    return run


# What a KEP-6080 derived attribute may evaluate to (k8s.io/dynamic-resource-allocation/cel, 1.37:
# isAllowedDerivedAttributeElementType): the attribute value types, or an unknown type checked at evaluation.
_DERIVED_ELEMENT_NAMES: Final = frozenset({"bool", "int", "string", "google.protobuf.Any", "dyn", "kubernetes.Semver"})


def _derived_type_allowed(t: CelType, lists: bool) -> bool:
    if t.name in _DERIVED_ELEMENT_NAMES and not t.params:
        return True
    return lists and t.name == "list" and len(t.params) == 1 and _derived_type_allowed(t.params[0], False)


def compile_expression(
    tree: Expr, decl: DeviceDeclaration, cost_limit: int, *, derived: bool = False, derived_lists: bool = False
) -> Compiled:
    """`derived`: a KEP-6080 derived attribute's expression, whose result is a value (a scalar, or with
    `derived_lists` a list of scalars) rather than a selector's bool."""
    compiler = _Compiler(decl, cost_limit)
    root = compiler.node(tree, {})
    if derived:
        if not _derived_type_allowed(root.type, derived_lists):
            scalars = "a primitive scalar (string, integer, boolean, semver)"
            allowed = f"{scalars} or a list of these scalars" if derived_lists else scalars
            raise CompileIssue(f"must evaluate to {allowed}, not {root.type}", -1)
    elif not (root.type == BOOL or root.type == decl.attribute_type):
        raise CompileIssue(f"must evaluate to bool or the unknown type, not {root.type}", -1)
    return Compiled(root.run, root.type, root.cost, compiler.cost_known)

