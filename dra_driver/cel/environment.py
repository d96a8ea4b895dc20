"""The DRA CEL environment: compile selector expressions once, evaluate them against devices.

What a selector sees (Kubernetes `dynamic-resource-allocation/cel`):
  device.driver                    string
  device.attributes[domain][id]    int | bool | string | Semver   (unqualified names live under the driver's domain)
  device.capacity[domain][id]      Quantity
  device.allowMultipleAllocations  bool
An unknown domain yields an empty map; an unknown attribute is an evaluation error. The result must be a
bool. The engine is this package's own (syntax, compiler, library, runtime); docs/allocator.md says why and
lists every function with the release that has it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, cast

from dra_driver.cel.compiler import COST_KEY, Compiled, CompileIssue, DeviceDeclaration, DomainMap, compile_expression
from dra_driver.cel.library import FUNCTIONS, to_cel_value
from dra_driver.cel.reads import Read, selector_reads
from dra_driver.cel.runtime import CelEvalError, type_name
from dra_driver.cel.syntax import SyntaxIssue, parse, position
from dra_driver.cel.types import ANY, DYN
from dra_driver.errors import DraDriverError
from dra_driver.k8s.quantity import Quantity
from dra_driver.k8s.semver import Semver

# resource.k8s.io/v1 CELSelectorExpressionMaxLength and CELSelectorExpressionMaxCost.
MAX_EXPRESSION_LENGTH: Final = 10 * 1024
MAX_COST: Final = 1_000_000
OLDEST_MINOR: Final = 34
NEWEST_MINOR: Final = 37
_DEFAULT_CACHE_SIZE: Final = 1024
_RESULT_CACHE_SIZE: Final = 65536
_EXCERPT: Final = 120

AttributeValue = int | bool | str | Semver


def _excerpt(expression: str) -> str:
    flat = " ".join(expression.split())
    return flat if len(flat) <= _EXCERPT else flat[: _EXCERPT - 3] + "..."


class CelError(DraDriverError):
    """A selector could not be compiled or evaluated. `str()` names the expression and the reason."""

    def __init__(self, expression: str, reason: str) -> None:
        super().__init__(f"CEL expression {_excerpt(expression)!r}: {reason}")
        self.expression = expression
        self.reason = reason


class CelCompileError(CelError):
    """The expression is too long or not valid CEL syntax."""


class CelRuntimeError(CelError):
    """Evaluation failed (missing attribute, type error, ...) or did not produce a bool."""


def split_qualified_name(name: str, driver: str) -> tuple[str, str]:
    """`domain/id` -> (domain, id); a bare `id` belongs to the driver's domain."""
    domain, sep, ident = name.rpartition("/")
    return (domain, ident) if sep else (driver, name)


@dataclass(frozen=True)
class DeviceInput:
    """One device as the selector sees it, with typed values (Semver for versions, Quantity for capacity)."""

    driver: str
    attributes: Mapping[str, AttributeValue] = field(default_factory=dict)  # qualified name -> value
    capacity: Mapping[str, Quantity] = field(default_factory=dict)  # qualified name -> value
    allow_multiple_allocations: bool = False


@dataclass(frozen=True)
class DeviceActivation:
    """A device converted once into the CEL activation; reuse it across every selector."""

    device: DeviceInput
    activation: Mapping[str, Any]


# How the scheduler words the "no such key" hint (k8s.io/dynamic-resource-allocation/cel/errors.go, 1.37).
_NO_SUCH_KEY_HINT: Final = " (the device has no such attribute or capacity; guard with has(...) or 'name' in map)"


def _describe_eval_error(err: CelEvalError) -> str:
    message = str(err)
    if message.startswith("no such key"):
        message += _NO_SUCH_KEY_HINT
    return message


@dataclass(frozen=True)
class CompiledSelector:
    """A compiled expression. `matches` raises CelRuntimeError; it never returns a non-bool.
    `max_cost` is the worst-case cost estimate (cel-go units); `cost_known` is False when some size in the
    expression could not be bounded (then the estimate is not a bound)."""

    expression: str
    _program: Any = field(repr=False, compare=False)
    _declare_allow_multiple: bool = field(default=True, repr=False, compare=False)
    # The device paths the result depends on (dra_driver.cel.reads); None: possibly anything.
    reads: tuple[Read, ...] | None = field(default=None, repr=False, compare=False)
    max_cost: int = field(default=0, compare=False)
    cost_known: bool = field(default=True, compare=False)

    def matches(self, device: DeviceActivation | DeviceInput) -> bool:
        converted = (
            device
            if isinstance(device, DeviceActivation)
            else _activation_of(device, declare_allow_multiple=self._declare_allow_multiple)
        )
        result = _run(self.expression, self._program, converted)
        if result is True or result is False:
            return result
        # k8s.io/dynamic-resource-allocation/cel DeviceMatches: ConvertToNative(bool) failed.
        raise CelRuntimeError(
            self.expression,
            f"CEL result of type {_result_type_name(result)} could not be converted to bool",
        )


def _run(expression: str, program: Callable[[dict[str, Any]], Any], device: DeviceActivation) -> Any:
    """A compiled program on one device, with its own cost counter; its errors as CelRuntimeError."""
    activation = dict(device.activation)
    activation[COST_KEY] = [0]
    try:
        return program(activation)
    except CelEvalError as err:
        raise CelRuntimeError(expression, _describe_eval_error(err)) from err
    except RecursionError as err:
        raise CelRuntimeError(expression, "expression nests too deeply to evaluate") from err


DerivedValue = AttributeValue | list[AttributeValue]


@dataclass(frozen=True)
class CompiledDerived:
    """A compiled KEP-6080 derived attribute: `evaluate` gives the value a matchAttribute/distinctAttribute
    constraint compares (a scalar, or a list of scalars of one type) and raises CelRuntimeError otherwise."""

    expression: str
    _program: Any = field(repr=False, compare=False)
    max_cost: int = field(default=0, compare=False)
    cost_known: bool = field(default=True, compare=False)

    def evaluate(self, device: DeviceActivation) -> DerivedValue:
        result = _run(self.expression, self._program, device)
        # k8s.io/dynamic-resource-allocation/cel valToDeviceAttribute (1.37): bool, int, string, semver, or a list
        # whose items all have the first item's type (an empty list is an empty string list).
        if _derived_scalar(result):
            return cast(AttributeValue, result)
        if isinstance(result, list | tuple):
            items = list(result)
            if items and not _derived_scalar(items[0]):
                raise CelRuntimeError(self.expression, f"unsupported list element type: {type_name(items[0])}")
            for i, item in enumerate(items):
                if type_name(item) != type_name(items[0]):
                    raise CelRuntimeError(
                        self.expression,
                        f"expected list element at index {i} to be {type_name(items[0])}, got {type_name(item)}",
                    )
            return cast(list[AttributeValue], items)
        raise CelRuntimeError(self.expression, f"unsupported CEL return type: {type_name(result)}")


def _derived_scalar(value: object) -> bool:
    return type_name(value) in ("bool", "int", "string", "kubernetes.Semver")


def _result_type_name(value: object) -> str:
    name = type_name(value)
    return name.removeprefix("kubernetes.")


def _activation_of(device: DeviceInput, *, declare_allow_multiple: bool) -> DeviceActivation:
    attributes: DomainMap = DomainMap()
    for name, value in device.attributes.items():
        domain, ident = split_qualified_name(name, device.driver)
        attributes.setdefault(domain, {})[ident] = to_cel_value(value)
    capacity: DomainMap = DomainMap()
    for name, quantity in device.capacity.items():
        domain, ident = split_qualified_name(name, device.driver)
        capacity.setdefault(domain, {})[ident] = quantity
    fields: dict[str, Any] = {
        "driver": device.driver,
        "attributes": attributes,
        "capacity": capacity,
    }
    # With DRAConsumableCapacity off the API server drops the device field, so the scheduler reads false.
    fields["allowMultipleAllocations"] = device.allow_multiple_allocations and declare_allow_multiple
    return DeviceActivation(device=device, activation={"device": fields})


_MISSING: Final = ("<missing>",)


def _value_key(value: Any) -> tuple[Any, ...]:
    """An exact, hashable stand-in for an attribute or capacity value: bool is not int, 1Gi is not 1024Mi
    (formats may show through), a Semver's build metadata counts."""
    if isinstance(value, Quantity):
        return ("quantity", value.nanos, value.format.value)
    if isinstance(value, Semver):
        return ("semver", value.major, value.minor, value.patch, value.prerelease, value.build)
    return (type(value), value)


_AMBIGUOUS: Final = ("<ambiguous>",)


def _lookup(values: Mapping[str, Any], driver: str, domain: str, ident: str) -> Any:
    """The value a selector reads as `<domain>.<ident>`, by straight lookups: _MISSING when the device has none,
    _AMBIGUOUS when only the grouped view can tell (a qualified id, or a value the device names both ways: then
    the later name wins, as in _activation_of)."""
    if "/" in ident:
        return _AMBIGUOUS
    qualified = values.get(domain + "/" + ident, _MISSING)
    bare = values.get(ident, _MISSING) if domain == driver else _MISSING
    if qualified is not _MISSING and bare is not _MISSING:
        return _AMBIGUOUS
    return bare if qualified is _MISSING else qualified


def values_key(
    reads: tuple[Read, ...],
    driver: str,
    attributes: Mapping[str, Any],
    capacity: Mapping[str, Any],
    allow_multiple: bool,
) -> tuple[Any, ...] | None:
    """`DeviceView.key` from a device's values, without building a view, for the common reads (single values
    named one way, the flag); None when only the grouped view can tell (a value named both ways, a qualified id,
    a whole domain map). Callers judging many devices use this first: it costs a few dict lookups."""
    parts: list[Any] = []
    for read in reads:
        if len(read) == 3:
            kind, domain, ident = read
            found = _lookup(attributes if kind == "attributes" else capacity, driver, domain, ident)
            if found is _AMBIGUOUS:
                return None
            if found is _MISSING:
                parts.append(_MISSING)
            else:
                scalar = type(found)
                parts.append((scalar, found) if scalar is str or scalar is int or scalar is bool else _value_key(found))
        elif read[0] == "allowMultipleAllocations":
            parts.append(allow_multiple)
        elif read[0] != "driver":  # the driver is always part of the key
            return None
    return tuple(parts)


class DeviceView:
    """One device for many selectors: its CEL activation and its values by (domain, id), both built lazily."""

    def __init__(self, device: DeviceInput, *, declare_allow_multiple: bool) -> None:
        self.device = device
        self.declare_allow_multiple = declare_allow_multiple
        self._activation: DeviceActivation | None = None
        self._domains: dict[str, dict[str, dict[str, Any]]] | None = None

    @property
    def activation(self) -> DeviceActivation:
        if self._activation is None:
            self._activation = _activation_of(self.device, declare_allow_multiple=self.declare_allow_multiple)
        return self._activation

    def _domain(self, kind: str, domain: str) -> dict[str, Any]:
        if self._domains is None:
            self._domains = {"attributes": {}, "capacity": {}}
            # Exactly as _activation_of groups them (a later name wins for the same domain/id).
            for name, value in self.device.attributes.items():
                d, ident = split_qualified_name(name, self.device.driver)
                self._domains["attributes"].setdefault(d, {})[ident] = value
            for name, quantity in self.device.capacity.items():
                d, ident = split_qualified_name(name, self.device.driver)
                self._domains["capacity"].setdefault(d, {})[ident] = quantity
        return self._domains[kind].get(domain, {})

    def key(self, reads: tuple[Read, ...]) -> tuple[Any, ...]:
        """What the result of a selector with these reads depends on (besides the driver), exactly."""
        device = self.device
        quick = values_key(reads, device.driver, device.attributes, device.capacity, device.allow_multiple_allocations)
        if quick is not None:
            return quick
        parts: list[Any] = []
        for read in reads:
            if read[0] == "driver":
                continue  # always part of the key
            if read[0] == "allowMultipleAllocations":
                parts.append(self.device.allow_multiple_allocations)
            elif len(read) == 2:
                parts.append(tuple((k, _value_key(v)) for k, v in self._domain(read[0], read[1]).items()))
            else:
                parts.append(self._value(read[0], read[1], read[2]))
        return tuple(parts)

    def _value(self, kind: str, domain: str, ident: str) -> tuple[Any, ...]:
        values = self.device.attributes if kind == "attributes" else self.device.capacity
        found = _lookup(values, self.device.driver, domain, ident)
        if found is not _AMBIGUOUS:
            return _MISSING if found is _MISSING else _value_key(found)
        grouped = self._domain(kind, domain)
        return _value_key(grouped[ident]) if ident in grouped else _MISSING


# Functions (and the sortBy macro) that not every supported release declares; all others exist in 1.34-1.37.
_EXT_LISTS_V3: Final = frozenset({"slice", "flatten", "sort", "sortBy", "lists.range", "reverse", "distinct"})


def declared_functions(minor: int, *, new_expressions: bool, list_type_attributes: bool) -> frozenset[str]:
    """The function names a release's DRA environment declares. The scheduler evaluates with the
    StoredExpressions environment (everything the release knows); the API server checks new selectors with
    NewExpressions (what the previous release knows, plus options whose feature gate is on)."""
    known = minor - 1 if new_expressions else minor
    names = set(FUNCTIONS) | {"sortBy"}
    if known < 34:  # ext.Lists(ListsVersion(3)), base environment 1.34
        names -= _EXT_LISTS_V3
    # `includes`: DRA environment 1.36 (gated by DRAListTypeAttributes for new expressions), Kubernetes lists
    # library version 1 from 1.37.
    if not (known >= 36 or (new_expressions and minor >= 36 and list_type_attributes)):
        names.discard("includes")
    return frozenset(names)


def format_issue(expression: str, issue: CompileIssue | SyntaxIssue) -> str:
    """cel-go's issue format: `ERROR: <input>:L:C: message` and the line with a caret."""
    if issue.offset < 0:
        return issue.message
    where = position(expression, min(issue.offset, len(expression)))
    caret = "." * (where.column - 1) + "^"
    return f"ERROR: <input>:{where.line}:{where.column}: {issue.message}\n | {where.line_text}\n | {caret}"


class DraCelEnvironment:
    """Compiles DRA selector expressions and caches the programs (bounded LRU, thread-safe).

    One instance is meant to live as long as the component that evaluates selectors: selectors repeat
    across thousands of devices and many allocation attempts, and compiling dominates a cold evaluation.

    `kubernetes_minor` picks the release whose environment this is (1.34-1.37; the oldest by default, the
    strictest). `new_expressions` gives the API server's check of a new selector instead of the scheduler's
    environment. `consumable_capacity` (DRAConsumableCapacity): off, `device.allowMultipleAllocations` reads
    false for the scheduler and is an undefined field for a new selector;
    `list_type_attributes` (DRAListTypeAttributes, on from 1.37) types attribute values as dyn.
    """

    def __init__(
        self,
        *,
        consumable_capacity: bool = True,
        cache_size: int = _DEFAULT_CACHE_SIZE,
        kubernetes_minor: int = OLDEST_MINOR,
        new_expressions: bool = False,
        list_type_attributes: bool | None = None,
        cost_limit: int = MAX_COST,
    ) -> None:
        if cache_size < 1:
            raise ValueError(f"cache_size must be >= 1, got {cache_size}")
        if not OLDEST_MINOR <= kubernetes_minor <= NEWEST_MINOR:
            raise ValueError(
                f"kubernetes_minor must be {OLDEST_MINOR}..{NEWEST_MINOR} (the supported 1.x releases), "
                f"got {kubernetes_minor}"
            )
        if cost_limit < 1:
            raise ValueError(f"cost_limit must be >= 1, got {cost_limit}")
        self.consumable_capacity = consumable_capacity
        self.kubernetes_minor = kubernetes_minor
        self.new_expressions = new_expressions
        self.cost_limit = cost_limit
        lists = kubernetes_minor >= 37 if list_type_attributes is None else list_type_attributes
        self._declaration = DeviceDeclaration(
            # The scheduler's (StoredExpressions) environment always declares the field; the API server's check
            # of a new selector declares it only with the gate.
            allow_multiple_allocations=consumable_capacity or not new_expressions,
            attribute_type=DYN if lists and kubernetes_minor >= 36 else ANY,
            functions=declared_functions(
                kubernetes_minor, new_expressions=new_expressions, list_type_attributes=lists
            ),
        )
        # A derived attribute may be a list in the scheduler's environment, for a new expression only with the gate.
        self._derived_lists = not new_expressions or lists
        self._cache_size = cache_size
        self._cache: OrderedDict[tuple[bool, str], CompiledSelector | CompiledDerived | CelCompileError] = OrderedDict()
        self._lock = threading.Lock()
        self._results: dict[tuple[Any, ...], bool | str] = {}

    def compile(self, expression: str) -> CompiledSelector:
        """Return the compiled selector; raise CelCompileError (also cached) for a bad expression."""
        return cast(CompiledSelector, self._cached(expression, derived=False))

    def _cached(self, expression: str, *, derived: bool) -> CompiledSelector | CompiledDerived:
        """Compiled once and kept, the least recently used dropped past the cache size; a CelCompileError is kept
        and raised as well."""
        key = (derived, expression)  # selectors and derived attributes check their result differently
        with self._lock:
            cached = self._cache.get(key)
            if cached is None:
                cached = self._compile_uncached(expression, derived=derived)
                self._cache[key] = cached
                if len(self._cache) > self._cache_size:
                    self._cache.popitem(last=False)
            else:
                self._cache.move_to_end(key)
        if isinstance(cached, CelCompileError):
            raise cached
        return cached

    def _compile_uncached(
        self, expression: str, *, derived: bool = False
    ) -> CompiledSelector | CompiledDerived | CelCompileError:
        if not isinstance(expression, str):
            return CelCompileError(repr(expression), "expression must be a string")
        if len(expression) > MAX_EXPRESSION_LENGTH:
            return CelCompileError(
                expression,
                f"expression is {len(expression)} characters long; the limit is {MAX_EXPRESSION_LENGTH}",
            )
        if not expression.strip():
            return CelCompileError(expression, "expression is empty")
        try:
            tree = parse(expression)
            compiled: Compiled = compile_expression(
                tree, self._declaration, self.cost_limit, derived=derived, derived_lists=self._derived_lists
            )
        except (SyntaxIssue, CompileIssue) as issue:
            return CelCompileError(expression, format_issue(expression, issue))
        except RecursionError:
            return CelCompileError(expression, "expression nests too deeply to compile")
        if derived:
            return CompiledDerived(expression, compiled.program, compiled.max_cost, compiled.cost_known)
        return CompiledSelector(
            expression,
            compiled.program,
            self.consumable_capacity,
            selector_reads(tree),
            max_cost=compiled.max_cost,
            cost_known=compiled.cost_known,
        )

    def compile_derived(self, expression: str) -> CompiledDerived:
        """A derived attribute's expression (KEP-6080), compiled and cached; raises CelCompileError. The
        scheduler's environment allows a list result; the API server's check of a new expression only with
        DRAListTypeAttributes."""
        return cast(CompiledDerived, self._cached(expression, derived=True))

    def check_new_derived(self, expression: str) -> str | None:
        """What the API server says about a new derived attribute's expression, or None."""
        return self._new_problem(expression, derived=True)

    def check_new_expression(self, expression: str) -> str | None:
        """What the API server says about a new selector (compile error or cost over the limit), or None."""
        return self._new_problem(expression, derived=False)

    def _new_problem(self, expression: str, *, derived: bool) -> str | None:
        try:
            compiled = self._cached(expression, derived=derived)
        except CelCompileError as err:
            return f"compilation failed: {err.reason}"
        if not compiled.cost_known or compiled.max_cost <= self.cost_limit:
            return None
        if derived:
            return "too complex, exceeds cost limit"
        # k8s.io/kubernetes pkg/apis/resource/validation: validateCELSelector
        return f"too complex, exceeds cost limit (estimated cost {compiled.max_cost}, limit {self.cost_limit})"

    def activate(self, device: DeviceInput, *, consumable_capacity: bool | None = None) -> DeviceActivation:
        """Convert a device once for many evaluations. `consumable_capacity` overrides the environment's
        gate (whether `device.allowMultipleAllocations` is declared) for this device."""
        declare = self.consumable_capacity if consumable_capacity is None else consumable_capacity
        return _activation_of(device, declare_allow_multiple=declare)

    def matches(self, expression: str, device: DeviceInput | DeviceActivation) -> bool:
        """Compile (cached) and evaluate one expression against one device."""
        activation = device if isinstance(device, DeviceActivation) else self.activate(device)
        return self.compile(expression).matches(activation)

    def matches_view(self, selector: CompiledSelector, view: DeviceView) -> bool:
        """`selector.matches(view.activation)`, evaluated once per distinct value of what the selector reads
        (its verdict, or its runtime error, is reused for every device that agrees on those values)."""
        if selector.reads is None:
            return selector.matches(view.activation)
        key = (selector.expression, view.declare_allow_multiple, view.device.driver, view.key(selector.reads))
        verdict = self._results.get(key)
        if verdict is None:
            try:
                verdict = selector.matches(view.activation)
            except CelRuntimeError as err:
                verdict = err.reason
            if len(self._results) >= _RESULT_CACHE_SIZE:
                self._results.clear()
            self._results[key] = verdict
        if isinstance(verdict, str):
            raise CelRuntimeError(selector.expression, verdict)
        return verdict

    def cache_info(self) -> tuple[int, int]:
        """(entries, capacity) of the compiled-program cache."""
        with self._lock:
            return len(self._cache), self._cache_size
