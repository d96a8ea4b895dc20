"""The DRA CEL environment: compile selector expressions once, evaluate them against devices.

What a selector sees (Kubernetes `dynamic-resource-allocation/cel`):
  device.driver                    string
  device.attributes[domain][id]    int | bool | string | Semver   (unqualified names live under the driver's domain)
  device.capacity[domain][id]      Quantity
  device.allowMultipleAllocations  bool (declared only with the DRAConsumableCapacity gate)
An unknown domain yields an empty map; an unknown attribute is an evaluation error. The result must be a
bool. The engine is cel-python (celpy); see docs/allocator.md for why.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import celpy
from celpy import celtypes
from celpy.celparser import CELParseError
from celpy.evaluation import CELEvalError

from dra_driver.cel.library import FUNCTIONS, to_cel_value
from dra_driver.cel.reads import Read, selector_reads
from dra_driver.errors import DraDriverError
from dra_driver.k8s.quantity import Quantity
from dra_driver.k8s.semver import Semver

__all__ = [
    "MAX_EXPRESSION_LENGTH",
    "AttributeValue",
    "CelCompileError",
    "CelError",
    "CelRuntimeError",
    "CompiledSelector",
    "DeviceInput",
    "DeviceView",
    "DraCelEnvironment",
    "PreparedDevice",
    "split_qualified_name",
    "values_key",
]

# resource.k8s.io/v1 CELSelectorExpressionMaxLength.
MAX_EXPRESSION_LENGTH: Final = 10 * 1024
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


class _DomainMap(celtypes.MapType):
    """domain -> (id -> value). An unknown domain reads as an empty map, as in Kubernetes, so that
    `"x" in device.attributes["other.domain"]` is false instead of an error."""

    def __getitem__(self, key: Any) -> Any:
        try:
            return super().__getitem__(key)
        except KeyError:
            return celtypes.MapType()


@dataclass(frozen=True)
class PreparedDevice:
    """A device converted once into the CEL activation; reuse it across every selector."""

    device: DeviceInput
    activation: Mapping[str, Any]


def _describe_eval_error(err: CELEvalError) -> str:
    message = str(err.args[0]) if err.args else "evaluation error"
    # celpy appends a dump of the whole activation to "undeclared reference" errors; keep the useful part.
    message = message.split(" (in activation", 1)[0]
    if message == "no such key" and len(err.args) > 2 and err.args[2]:
        message = f"no such key: {str(err.args[2][0])!r}"
    if message.startswith(("no such key", "no such member")):
        message += " (the device has no such attribute or capacity; guard with has(...) or 'name' in map)"
    return message


@dataclass(frozen=True)
class CompiledSelector:
    """A compiled expression. `matches` raises CelRuntimeError; it never returns a non-bool."""

    expression: str
    _program: Any = field(repr=False, compare=False)
    _declare_allow_multiple: bool = field(default=True, repr=False, compare=False)
    # The device paths the result depends on (dra_driver.cel.reads); None: possibly anything.
    reads: tuple[Read, ...] | None = field(default=None, repr=False, compare=False)

    def matches(self, device: PreparedDevice | DeviceInput) -> bool:
        prepared = (
            device
            if isinstance(device, PreparedDevice)
            else _prepare(device, declare_allow_multiple=self._declare_allow_multiple)
        )
        try:
            result = self._program.evaluate(dict(prepared.activation))
        except CELEvalError as err:
            raise CelRuntimeError(self.expression, _describe_eval_error(err)) from err
        except RecursionError as err:
            raise CelRuntimeError(self.expression, "expression nests too deeply to evaluate") from err
        except Exception as err:  # celpy surfaces internal failures as plain Python exceptions
            raise CelRuntimeError(self.expression, f"evaluation failed: {type(err).__name__}: {err}") from err
        if not isinstance(result, celtypes.BoolType):
            raise CelRuntimeError(
                self.expression, f"must evaluate to bool, got {type(result).__name__.removesuffix('Type').lower()}"
            )
        return bool(result)


def _prepare(device: DeviceInput, *, declare_allow_multiple: bool) -> PreparedDevice:
    attributes: dict[str, dict[str, Any]] = {}
    for name, value in device.attributes.items():
        domain, ident = split_qualified_name(name, device.driver)
        attributes.setdefault(domain, {})[ident] = to_cel_value(value)
    capacity: dict[str, dict[str, Any]] = {}
    for name, quantity in device.capacity.items():
        domain, ident = split_qualified_name(name, device.driver)
        capacity.setdefault(domain, {})[ident] = quantity
    fields: dict[Any, Any] = {
        celtypes.StringType("driver"): celtypes.StringType(device.driver),
        celtypes.StringType("attributes"): _DomainMap(
            {
                celtypes.StringType(d): celtypes.MapType({celtypes.StringType(k): v for k, v in ids.items()})
                for d, ids in attributes.items()
            }
        ),
        celtypes.StringType("capacity"): _DomainMap(
            {
                celtypes.StringType(d): celtypes.MapType({celtypes.StringType(k): v for k, v in ids.items()})
                for d, ids in capacity.items()
            }
        ),
    }
    if declare_allow_multiple:
        fields[celtypes.StringType("allowMultipleAllocations")] = celtypes.BoolType(device.allow_multiple_allocations)
    return PreparedDevice(device=device, activation={"device": celtypes.MapType(fields)})


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
    the later name wins, as in _prepare)."""
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
        self._prepared: PreparedDevice | None = None
        self._domains: dict[str, dict[str, dict[str, Any]]] | None = None

    @property
    def prepared(self) -> PreparedDevice:
        if self._prepared is None:
            self._prepared = _prepare(self.device, declare_allow_multiple=self.declare_allow_multiple)
        return self._prepared

    def _domain(self, kind: str, domain: str) -> dict[str, Any]:
        if self._domains is None:
            self._domains = {"attributes": {}, "capacity": {}}
            # Exactly as _prepare groups them (a later name wins for the same domain/id).
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


class DraCelEnvironment:
    """Compiles DRA selector expressions and caches the programs (bounded LRU, thread-safe).

    One instance is meant to live as long as the component that evaluates selectors: selectors repeat
    across thousands of devices and many allocation attempts, and parsing dominates a cold evaluation.
    """

    def __init__(self, *, consumable_capacity: bool = True, cache_size: int = _DEFAULT_CACHE_SIZE) -> None:
        if cache_size < 1:
            raise ValueError(f"cache_size must be >= 1, got {cache_size}")
        # DRAConsumableCapacity decides whether `device.allowMultipleAllocations` exists at all.
        self.consumable_capacity = consumable_capacity
        self._cache_size = cache_size
        self._cache: OrderedDict[str, CompiledSelector | CelCompileError] = OrderedDict()
        self._lock = threading.Lock()
        self._env = celpy.Environment()
        self._results: dict[tuple[Any, ...], bool | str] = {}

    def compile(self, expression: str) -> CompiledSelector:
        """Return the compiled selector; raise CelCompileError (also cached) for a bad expression."""
        with self._lock:
            cached = self._cache.get(expression)
            if cached is not None:
                self._cache.move_to_end(expression)
            else:
                cached = self._compile_uncached(expression)
                self._cache[expression] = cached
                if len(self._cache) > self._cache_size:
                    self._cache.popitem(last=False)
        if isinstance(cached, CelCompileError):
            raise cached
        return cached

    def _compile_uncached(self, expression: str) -> CompiledSelector | CelCompileError:
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
            ast = self._env.compile(expression)
            program = self._env.program(ast, functions=FUNCTIONS)
        except CELParseError as err:
            detail = " ".join(str(err).split())
            return CelCompileError(expression, f"syntax error: {detail}")
        except RecursionError:
            return CelCompileError(expression, "expression nests too deeply to compile")
        return CompiledSelector(expression, program, self.consumable_capacity, selector_reads(ast))

    def prepare(self, device: DeviceInput, *, consumable_capacity: bool | None = None) -> PreparedDevice:
        """Convert a device once for many evaluations. `consumable_capacity` overrides the environment's
        gate (whether `device.allowMultipleAllocations` is declared) for this device."""
        declare = self.consumable_capacity if consumable_capacity is None else consumable_capacity
        return _prepare(device, declare_allow_multiple=declare)

    def matches(self, expression: str, device: DeviceInput | PreparedDevice) -> bool:
        """Compile (cached) and evaluate one expression against one device."""
        prepared = device if isinstance(device, PreparedDevice) else self.prepare(device)
        return self.compile(expression).matches(prepared)

    def matches_view(self, selector: CompiledSelector, view: DeviceView) -> bool:
        """`selector.matches(view.prepared)`, evaluated once per distinct value of what the selector reads
        (its verdict, or its runtime error, is reused for every device that agrees on those values)."""
        if selector.reads is None:
            return selector.matches(view.prepared)
        key = (selector.expression, view.declare_allow_multiple, view.device.driver, view.key(selector.reads))
        verdict = self._results.get(key)
        if verdict is None:
            try:
                verdict = selector.matches(view.prepared)
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
