"""Pure validation of resource.k8s.io/v1 objects, following the kube-apiserver's rules.

Every check takes plain JSON-shaped values (what `json.loads` gives, camelCase keys) and returns a
list of `FieldError`s; nothing here does I/O or raises on bad input, so the slice builder can
self-check what it is about to publish, the webhook can reuse it, and the sandbox API server turns
the list into a 422 `Invalid` Status with one cause per error.

Field paths use the apiserver's notation (`field.Path`): `spec.devices[3].attributes[productName]`
(list indexes and map keys in brackets), so messages read exactly like a real cluster's.

Rules come from shared/specs/interfaces.md §3 (types, oneOf rules, §3.6 limits). Version-dependent
rules follow `ValidationOptions.kube_version`; all DRA feature gates are treated as enabled, because
the driver is tested with partitionable devices, taints and consumable capacity switched on.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence, Sized
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Final

from dra_driver.k8s.quantity import parse_quantity as _parse_quantity

GROUP: Final = "resource.k8s.io"
API_VERSION: Final = "resource.k8s.io/v1"

# ---------------------------------------------------------------------------------------------
# Errors and paths
# ---------------------------------------------------------------------------------------------

# Cause types exactly as metav1.CauseType spells them, so Status.details.causes[].reason matches.
REQUIRED: Final = "FieldValueRequired"
INVALID: Final = "FieldValueInvalid"
DUPLICATE: Final = "FieldValueDuplicate"
NOT_SUPPORTED: Final = "FieldValueNotSupported"
FORBIDDEN: Final = "FieldValueForbidden"
TOO_LONG: Final = "FieldValueTooLong"
TOO_MANY: Final = "FieldValueTooMany"
TYPE_INVALID: Final = "FieldValueTypeInvalid"

_PREFIX: Final[Mapping[str, str]] = {
    REQUIRED: "Required value",
    INVALID: "Invalid value",
    DUPLICATE: "Duplicate value",
    NOT_SUPPORTED: "Unsupported value",
    FORBIDDEN: "Forbidden",
    TOO_LONG: "Too long",
    TOO_MANY: "Too many",
    TYPE_INVALID: "Invalid value",
}

_NO_VALUE: Final = object()


@dataclass(frozen=True)
class FieldError:
    """One rejected field: where (`field`), what kind of problem (`reason`) and how to fix it (`detail`)."""

    field: str
    reason: str
    detail: str = ""
    value: object = _NO_VALUE

    @property
    def message(self) -> str:
        """The apiserver's wording, e.g. `Invalid value: "X": a lowercase RFC 1123 label must ...`."""
        parts = [_PREFIX.get(self.reason, self.reason)]
        if self.value is not _NO_VALUE and self.reason in (INVALID, DUPLICATE, NOT_SUPPORTED, TOO_MANY, TYPE_INVALID):
            parts.append(_render_value(self.value))
        if self.detail:
            parts.append(self.detail)
        return ": ".join(parts)

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


def _render_value(value: object) -> str:
    if isinstance(value, str):
        return json.dumps(value)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 80 else text[:77] + "..."


def format_errors(errors: Sequence[FieldError]) -> str:
    """`[a: Required value, b: Invalid value: ...]` as in the apiserver's aggregate message."""
    if len(errors) == 1:
        return str(errors[0])
    return "[" + ", ".join(str(e) for e in errors) + "]"


def child(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def index(path: str, i: int) -> str:
    return f"{path}[{i}]"


def key(path: str, k: str) -> str:
    return f"{path}[{k}]"


class _Errors:
    """Accumulator; keeps the checks below readable (`errs.required(path, ...)`)."""

    def __init__(self) -> None:
        self.items: list[FieldError] = []

    def add(self, path: str, reason: str, detail: str = "", value: object = _NO_VALUE) -> None:
        self.items.append(FieldError(path, reason, detail, value))

    def required(self, path: str, detail: str = "") -> None:
        self.add(path, REQUIRED, detail)

    def invalid(self, path: str, value: object, detail: str) -> None:
        self.add(path, INVALID, detail, value)

    def forbidden(self, path: str, detail: str) -> None:
        self.add(path, FORBIDDEN, detail)

    def duplicate(self, path: str, value: object) -> None:
        self.add(path, DUPLICATE, "", value)

    def not_supported(self, path: str, value: object, supported: Iterable[str]) -> None:
        self.add(path, NOT_SUPPORTED, "supported values: " + ", ".join(json.dumps(s) for s in supported), value)

    def too_many(self, path: str, actual: int, limit: int, what: str = "items") -> None:
        self.add(path, TOO_MANY, f"must have at most {limit} {what}", actual)

    def too_long(self, path: str, limit: int) -> None:
        self.add(path, TOO_LONG, f"may not be more than {limit} bytes")

    def type_invalid(self, path: str, value: object, expected: str) -> None:
        self.add(path, TYPE_INVALID, f"must be {expected}", value)


# ---------------------------------------------------------------------------------------------
# Name and value formats
# ---------------------------------------------------------------------------------------------

_DNS_LABEL_RE: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN_RE: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_C_IDENTIFIER_RE: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_QUALIFIED_NAME_PART_RE: Final = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
# Semantic Versioning 2.0.0 grammar (semver.org): numeric parts without leading zeros,
# optional pre-release and build metadata.
_SEMVER_RE: Final = re.compile(
    r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(-(0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(\.(0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*)?"
    r"(\+[0-9a-zA-Z-]+(\.[0-9a-zA-Z-]+)*)?"
)

DNS_LABEL_MAX: Final = 63
DNS_SUBDOMAIN_MAX: Final = 253

_DNS_LABEL_MSG: Final = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start "
    "and end with an alphanumeric character (e.g. 'my-name', or '123-abc')"
)
_DNS_SUBDOMAIN_MSG: Final = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and "
    "must start and end with an alphanumeric character (e.g. 'example.com')"
)
_C_IDENTIFIER_MSG: Final = (
    "a valid C identifier must start with alphabetic character or '_', followed by a string of "
    "alphanumeric characters or '_' (e.g. 'my_name', or 'MY_NAME', or 'MyName')"
)
_QUALIFIED_NAME_MSG: Final = (
    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
    "alphanumeric character (e.g. 'MyName', or 'my.name', or '123-abc'), with an optional DNS subdomain "
    "prefix and '/' (e.g. 'example.com/MyName')"
)


def dns_label_problems(value: str) -> list[str]:
    out = []
    if len(value) > DNS_LABEL_MAX:
        out.append(f"must be no more than {DNS_LABEL_MAX} characters")
    if not _DNS_LABEL_RE.fullmatch(value):
        out.append(_DNS_LABEL_MSG)
    return out


def dns_subdomain_problems(value: str, max_len: int = DNS_SUBDOMAIN_MAX) -> list[str]:
    out = []
    if len(value) > max_len:
        out.append(f"must be no more than {max_len} characters")
    if not _DNS_SUBDOMAIN_RE.fullmatch(value):
        out.append(_DNS_SUBDOMAIN_MSG)
    return out


def is_dns_label(value: str) -> bool:
    return not dns_label_problems(value)


def is_dns_subdomain(value: str) -> bool:
    return not dns_subdomain_problems(value)


def qualified_name_problems(value: str) -> list[str]:
    """Label-key style names (`[prefix/]name`, name ≤63, prefix a DNS subdomain)."""
    parts = value.split("/")
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            return ["prefix part must be non-empty"]
        out = [f"prefix part {p}" for p in dns_subdomain_problems(prefix)]
        if out:
            return out
    else:
        return [_QUALIFIED_NAME_MSG]
    if not name:
        return ["name part must be non-empty"]
    if len(name) > 63:
        return ["name part must be no more than 63 characters"]
    if not _QUALIFIED_NAME_PART_RE.fullmatch(name):
        return [_QUALIFIED_NAME_MSG]
    return []


def label_value_problems(value: str) -> list[str]:
    if value == "":
        return []
    out = []
    if len(value) > 63:
        out.append("must be no more than 63 characters")
    if not _QUALIFIED_NAME_PART_RE.fullmatch(value):
        out.append(
            "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
            "and must start and end with an alphanumeric character"
        )
    return out


def is_semver(value: str) -> bool:
    return _SEMVER_RE.fullmatch(value) is not None


def parse_quantity(value: object) -> Fraction:
    """Parse a Kubernetes `resource.Quantity` (`40Gi`, `500m`, `1.5`, `1e3`) into an exact number.

    Raises ValueError naming the accepted forms. JSON numbers are accepted as the apiserver does. The grammar
    is the one shared implementation in `dra_driver.k8s.quantity`.
    """
    if isinstance(value, bool):
        raise ValueError("a quantity must be a string like '40Gi' or a number, not a boolean")
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        return Fraction(str(value))
    if not isinstance(value, str):
        raise ValueError("a quantity must be a string like '40Gi', '500m' or '4'")
    return _parse_quantity(value).as_fraction()


def is_quantity(value: object) -> bool:
    try:
        parse_quantity(value)
    except ValueError:
        return False
    return True


# ---------------------------------------------------------------------------------------------
# Options and version-dependent limits
# ---------------------------------------------------------------------------------------------

CelCheck = Callable[[str], "str | None"]


@dataclass(frozen=True)
class Limits:
    """§3.6 limits for one Kubernetes minor version."""

    max_devices: int = 128
    max_devices_advanced: int = 64  # when any device has taints or consumesCounters (1.35+)
    max_attributes_and_capacities: int = 32
    max_attribute_values: int = 48  # scalars + list items per device (1.36 list attributes)
    max_counter_sets: int = 8
    max_counters_per_set: int = 32
    max_counters_total_1_34: int = 32  # 1.34: across all sets in a slice
    max_consumes_counters: int = 2
    max_counters_per_consumption: int = 32
    max_taints: int = 16
    max_binding_conditions: int = 4
    max_string_attribute: int = 64
    max_driver_name: int = 63
    max_attribute_id: int = 32
    max_pool_name: int = 253
    max_cel_expression: int = 10 * 1024
    max_opaque_parameters: int = 10 * 1024
    max_requests: int = 32
    max_constraints: int = 32
    max_config: int = 32
    max_selectors: int = 32
    max_subrequests: int = 8
    max_tolerations: int = 16
    max_allocation_results: int = 32
    max_allocation_config: int = 64
    max_reserved_for: int = 256
    max_device_conditions: int = 8
    max_network_ips: int = 16
    max_interface_name: int = 256
    max_hardware_address: int = 128
    max_valid_values: int = 10
    # Behaviour switches by version.
    devices_xor_shared_counters: bool = True  # 1.35+
    advanced_device_cap: bool = True  # 1.35+: the 64-device rule
    taint_effect_none: bool = True  # 1.35+
    list_attributes: bool = False  # 1.36+
    per_set_counter_limits: bool = True  # 1.35+ (1.34 used one slice-wide total)


def limits_for(kube_version: tuple[int, int]) -> Limits:
    """The rule set a given Kubernetes minor version applies (1.34 is the first with resource.k8s.io/v1)."""
    minor = kube_version[1] if kube_version[0] == 1 else 99
    if minor <= 34:
        return Limits(
            max_taints=4,
            max_consumes_counters=32,
            devices_xor_shared_counters=False,
            advanced_device_cap=False,
            taint_effect_none=False,
            per_set_counter_limits=False,
        )
    if minor == 35:
        return Limits()
    return Limits(list_attributes=True)


def parse_kube_version(text: str) -> tuple[int, int]:
    """`"1.35.0"`, `"v1.35.2"` or `"1.36"` -> (1, 35)."""
    m = re.match(r"v?(\d+)\.(\d+)", text.strip())
    if not m:
        raise ValueError(f"kube version {text!r} is not of the form 1.35.0")
    return int(m.group(1)), int(m.group(2))


@dataclass(frozen=True)
class ValidationOptions:
    """`kube_version` picks the rule set; `cel_check` (optional) compiles a CEL selector and returns
    an error message or None, so a CEL engine can be plugged in without this module importing one."""

    kube_version: tuple[int, int] = (1, 35)
    cel_check: CelCheck | None = None

    @property
    def limits(self) -> Limits:
        return limits_for(self.kube_version)


DEFAULT_OPTIONS: Final = ValidationOptions()

# ---------------------------------------------------------------------------------------------
# Typed accessors: wrong JSON types become errors, never exceptions
# ---------------------------------------------------------------------------------------------


def _map(errs: _Errors, value: object, path: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if isinstance(value, Mapping):
        return value
    errs.type_invalid(path, value, "an object")
    return {}


def _list(errs: _Errors, value: object, path: str) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, list):
        return value
    errs.type_invalid(path, value, "a list")
    return []


def _str(errs: _Errors, value: object, path: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value
    errs.type_invalid(path, value, "a string")
    return None


def _bool(errs: _Errors, value: object, path: str) -> bool | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return value
    errs.type_invalid(path, value, "a boolean")
    return None


def _int(errs: _Errors, value: object, path: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63:
        return value
    errs.type_invalid(path, value, "a 64-bit integer")
    return None


# ---------------------------------------------------------------------------------------------
# Reusable field checks
# ---------------------------------------------------------------------------------------------


def _check_dns_label(errs: _Errors, value: object, path: str, *, required: bool = True) -> str | None:
    text = _str(errs, value, path)
    if not text:
        if required:
            errs.required(path)
        return None
    for problem in dns_label_problems(text):
        errs.invalid(path, text, problem)
    return text


def _check_dns_subdomain(
    errs: _Errors, value: object, path: str, *, max_len: int = DNS_SUBDOMAIN_MAX, required: bool = True
) -> str | None:
    text = _str(errs, value, path)
    if not text:
        if required:
            errs.required(path)
        return None
    if len(text) > max_len:
        errs.too_long(path, max_len)
    if not _DNS_SUBDOMAIN_RE.fullmatch(text):
        errs.invalid(path, text, _DNS_SUBDOMAIN_MSG)
    return text


def _check_qualified_name(errs: _Errors, value: object, path: str, *, required: bool = True) -> str | None:
    text = _str(errs, value, path)
    if not text:
        if required:
            errs.required(path)
        return None
    for problem in qualified_name_problems(text):
        errs.invalid(path, text, problem)
    return text


def _check_driver_name(errs: _Errors, value: object, path: str, limits: Limits) -> str | None:
    return _check_dns_subdomain(errs, value, path, max_len=limits.max_driver_name)


def _check_quantity(errs: _Errors, value: object, path: str) -> Fraction | None:
    if value is None or value == "":
        errs.required(path)
        return None
    try:
        return parse_quantity(value)
    except ValueError as exc:
        errs.invalid(path, value, str(exc))
        return None


def _check_count(errs: _Errors, items: Sized, path: str, limit: int, what: str = "items") -> None:
    if len(items) > limit:
        errs.too_many(path, len(items), limit, what)


def _check_attribute_name(errs: _Errors, name: str, path: str, limits: Limits, *, fully_qualified: bool) -> None:
    """`QualifiedName` = `[domain/]id`: id a C identifier ≤32, domain a DNS subdomain ≤63."""
    domain, sep, ident = name.rpartition("/")
    if not sep:
        domain, ident = "", name
        if fully_qualified:
            errs.invalid(path, name, "a fully qualified name must be a domain and a name separated by a slash")
    elif not domain:
        errs.invalid(path, name, "the domain must not be empty")
    if domain:
        if len(domain) > limits.max_driver_name:
            errs.too_long(path, limits.max_driver_name)
        if not _DNS_SUBDOMAIN_RE.fullmatch(domain):
            errs.invalid(path, domain, _DNS_SUBDOMAIN_MSG)
    if not ident:
        errs.required(path, "the name after the domain must not be empty")
        return
    if len(ident) > limits.max_attribute_id:
        errs.too_long(path, limits.max_attribute_id)
    if not _C_IDENTIFIER_RE.fullmatch(ident):
        errs.invalid(path, ident, _C_IDENTIFIER_MSG)


def _check_unique_names(errs: _Errors, items: Sequence[Any], path: str, field_name: str = "name") -> None:
    seen: set[str] = set()
    for i, item in enumerate(items):
        if not isinstance(item, Mapping):
            continue
        name = item.get(field_name)
        if isinstance(name, str) and name:
            if name in seen:
                errs.duplicate(child(index(path, i), field_name), name)
            seen.add(name)


def _check_cel_selectors(errs: _Errors, value: object, path: str, options: ValidationOptions) -> None:
    limits = options.limits
    selectors = _list(errs, value, path)
    _check_count(errs, selectors, path, limits.max_selectors)
    for i, sel in enumerate(selectors):
        sel_path = index(path, i)
        sel_map = _map(errs, sel, sel_path)
        cel = sel_map.get("cel")
        if cel is None:
            errs.required(child(sel_path, "cel"), "exactly one selector type must be set; use cel: {expression: ...}")
            continue
        expr_path = child(child(sel_path, "cel"), "expression")
        expr = _str(errs, _map(errs, cel, child(sel_path, "cel")).get("expression"), expr_path)
        if not expr or not expr.strip():
            errs.required(expr_path, "a CEL expression returning bool, e.g. device.driver == \"gpu.dra.dev\"")
            continue
        if len(expr) > limits.max_cel_expression:
            errs.too_long(expr_path, limits.max_cel_expression)
            continue
        if options.cel_check is not None:
            problem = options.cel_check(expr)
            if problem:
                errs.invalid(expr_path, expr, problem)


def _check_opaque_config(errs: _Errors, entry: Mapping[str, Any], path: str, limits: Limits) -> None:
    opaque = entry.get("opaque")
    opaque_path = child(path, "opaque")
    if opaque is None:
        errs.required(opaque_path, "exactly one configuration type must be set; use opaque: {driver, parameters}")
        return
    op = _map(errs, opaque, opaque_path)
    _check_driver_name(errs, op.get("driver"), child(opaque_path, "driver"), limits)
    params_path = child(opaque_path, "parameters")
    params = op.get("parameters")
    if params is None:
        errs.required(params_path, "a JSON object with the driver's configuration, e.g. {apiVersion, kind, ...}")
        return
    if not isinstance(params, Mapping):
        errs.invalid(params_path, params, "parameters must be a valid JSON object")
        return
    if len(json.dumps(params, separators=(",", ":"))) > limits.max_opaque_parameters:
        errs.too_long(params_path, limits.max_opaque_parameters)


def _check_request_refs(errs: _Errors, value: object, path: str, known: Mapping[str, frozenset[str]]) -> None:
    refs = _list(errs, value, path)
    seen: set[str] = set()
    for i, ref in enumerate(refs):
        ref_path = index(path, i)
        text = _str(errs, ref, ref_path)
        if text is None:
            continue
        if text in seen:
            errs.duplicate(ref_path, text)
        seen.add(text)
        main, sep, sub = text.partition("/")
        if main not in known or (sep and sub not in known[main]):
            errs.invalid(ref_path, text, "must be the name of a request in the claim or the name of a request and "
                         "a subrequest separated by '/'")


def _check_node_selector(errs: _Errors, value: object, path: str, *, single_term: bool) -> None:
    sel = _map(errs, value, path)
    terms_path = child(path, "nodeSelectorTerms")
    terms = _list(errs, sel.get("nodeSelectorTerms"), terms_path)
    if not terms:
        errs.required(terms_path, "must have at least one node selector term")
    elif single_term and len(terms) != 1:
        errs.invalid(terms_path, len(terms), "must have exactly one node selector term")
    for t, term in enumerate(terms):
        term_path = index(terms_path, t)
        term_map = _map(errs, term, term_path)
        for list_name, key_check in (("matchExpressions", True), ("matchFields", False)):
            reqs_path = child(term_path, list_name)
            for r, req in enumerate(_list(errs, term_map.get(list_name), reqs_path)):
                req_path = index(reqs_path, r)
                req_map = _map(errs, req, req_path)
                if key_check:
                    _check_qualified_name(errs, req_map.get("key"), child(req_path, "key"))
                elif req_map.get("key") != "metadata.name":
                    errs.invalid(child(req_path, "key"), req_map.get("key"), "only metadata.name is supported")
                op = req_map.get("operator")
                values = _list(errs, req_map.get("values"), child(req_path, "values"))
                ops = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt") if key_check else ("In", "NotIn")
                if op not in ops:
                    errs.not_supported(child(req_path, "operator"), op, ops)
                elif op in ("In", "NotIn") and not values:
                    errs.required(child(req_path, "values"), "must be specified when `operator` is 'In' or 'NotIn'")
                elif op in ("Exists", "DoesNotExist") and values:
                    errs.forbidden(child(req_path, "values"),
                                   "may not be specified when `operator` is 'Exists' or 'DoesNotExist'")
                elif op in ("Gt", "Lt") and len(values) != 1:
                    errs.required(child(req_path, "values"), "must be specified single value when `operator` is "
                                  "'Lt' or 'Gt'")


def _check_taint_like(
    errs: _Errors, entry: Mapping[str, Any], path: str, limits: Limits, *, toleration: bool
) -> None:
    effects = ["NoSchedule", "NoExecute"] + (["None"] if limits.taint_effect_none else [])
    k = entry.get("key")
    if toleration:
        if k not in (None, ""):
            _check_qualified_name(errs, k, child(path, "key"))
        op = entry.get("operator", "Equal") or "Equal"
        value = _str(errs, entry.get("value"), child(path, "value")) or ""
        if op == "Exists":
            if value:
                errs.invalid(child(path, "operator"), op, "value must be empty when `operator` is 'Exists'")
        elif op == "Equal":
            if not k:
                errs.invalid(child(path, "operator"), op, "operator must be Exists when `key` is empty, which means "
                             "\"match all values and all keys\"")
            for problem in label_value_problems(value):
                errs.invalid(child(path, "value"), value, problem)
        else:
            errs.not_supported(child(path, "operator"), op, ["Equal", "Exists"])
        effect = entry.get("effect")
        if effect not in (None, "") and effect not in effects:
            errs.not_supported(child(path, "effect"), effect, effects)
        seconds = _int(errs, entry.get("tolerationSeconds"), child(path, "tolerationSeconds"))
        if seconds is not None and effect != "NoExecute":
            errs.invalid(child(path, "effect"), effect, "effect must be 'NoExecute' when `tolerationSeconds` is set")
        return
    _check_qualified_name(errs, k, child(path, "key"))
    value = _str(errs, entry.get("value"), child(path, "value")) or ""
    for problem in label_value_problems(value):
        errs.invalid(child(path, "value"), value, problem)
    effect = entry.get("effect")
    if effect in (None, ""):
        errs.required(child(path, "effect"), "one of " + ", ".join(effects))
    elif effect not in effects:
        errs.not_supported(child(path, "effect"), effect, effects)


# ---------------------------------------------------------------------------------------------
# Object metadata (shared by every kind; the sandbox applies it to all of them)
# ---------------------------------------------------------------------------------------------

NameCheck = Callable[[str], list[str]]
MAX_ANNOTATIONS_BYTES: Final = 256 * 1024


def path_segment_name_problems(value: str) -> list[str]:
    """Names of custom resources only need to be usable as a URL path segment."""
    if value in (".", ".."):
        return [f"may not be '{value}'"]
    for bad in ("/", "%"):
        if bad in value:
            return [f"may not contain '{bad}'"]
    return []


def validate_object_meta(
    meta: object,
    path: str = "metadata",
    *,
    name_check: NameCheck = dns_subdomain_problems,
    require_name: bool = True,
    namespaced: bool | None = None,
) -> list[FieldError]:
    """Checks every kind shares: name present and well-formed, labels/annotations/ownerReferences valid.

    `namespaced=True` requires a namespace, `False` forbids one, `None` (client-side use) skips it.
    """
    errs = _Errors()
    m = _map(errs, meta, path)
    name = _str(errs, m.get("name"), child(path, "name"))
    generate = _str(errs, m.get("generateName"), child(path, "generateName"))
    if name:
        for problem in name_check(name):
            errs.invalid(child(path, "name"), name, problem)
    elif require_name and not generate:
        errs.required(child(path, "name"), "name or generateName is required")
    namespace = _str(errs, m.get("namespace"), child(path, "namespace"))
    if namespaced is True:
        if not namespace:
            errs.required(child(path, "namespace"))
        else:
            for problem in dns_label_problems(namespace):
                errs.invalid(child(path, "namespace"), namespace, problem)
    elif namespaced is False and namespace:
        errs.forbidden(child(path, "namespace"), "not allowed on this type")
    labels = _map(errs, m.get("labels"), child(path, "labels"))
    for k, v in labels.items():
        for problem in qualified_name_problems(k):
            errs.invalid(child(path, "labels"), k, problem)
        if not isinstance(v, str):
            errs.type_invalid(key(child(path, "labels"), k), v, "a string")
            continue
        for problem in label_value_problems(v):
            errs.invalid(key(child(path, "labels"), k), v, problem)
    annotations = _map(errs, m.get("annotations"), child(path, "annotations"))
    total = 0
    for k, v in annotations.items():
        for problem in qualified_name_problems(k.lower()):
            errs.invalid(child(path, "annotations"), k, problem)
        if not isinstance(v, str):
            errs.type_invalid(key(child(path, "annotations"), k), v, "a string")
            continue
        total += len(k) + len(v)
    if total > MAX_ANNOTATIONS_BYTES:
        errs.too_long(child(path, "annotations"), MAX_ANNOTATIONS_BYTES)
    refs_path = child(path, "ownerReferences")
    controllers = 0
    for i, ref in enumerate(_list(errs, m.get("ownerReferences"), refs_path)):
        ref_path = index(refs_path, i)
        r = _map(errs, ref, ref_path)
        for f in ("apiVersion", "kind", "name", "uid"):
            if not r.get(f):
                errs.required(child(ref_path, f))
        if r.get("controller") is True:
            controllers += 1
    if controllers > 1:
        errs.invalid(refs_path, controllers, "Only one reference can have Controller set to true")
    for i, fin in enumerate(_list(errs, m.get("finalizers"), child(path, "finalizers"))):
        fin_text = _str(errs, fin, index(child(path, "finalizers"), i))
        if fin_text is not None:
            for problem in qualified_name_problems(fin_text):
                errs.invalid(index(child(path, "finalizers"), i), fin_text, problem)
    return errs.items


# ---------------------------------------------------------------------------------------------
# ResourceSlice
# ---------------------------------------------------------------------------------------------

_SCALAR_ATTRIBUTE_TYPES: Final = ("int", "bool", "string", "version")
_LIST_ATTRIBUTE_TYPES: Final = ("ints", "bools", "strings", "versions")


def _check_attribute_value(
    errs: _Errors, value: object, path: str, limits: Limits
) -> tuple[int, bool]:
    """Returns (number of values, is a list attribute)."""
    attr = _map(errs, value, path)
    allowed = _SCALAR_ATTRIBUTE_TYPES + (_LIST_ATTRIBUTE_TYPES if limits.list_attributes else ())
    present = [t for t in _SCALAR_ATTRIBUTE_TYPES + _LIST_ATTRIBUTE_TYPES if attr.get(t) is not None]
    for t in present:
        if t not in allowed:
            errs.forbidden(child(path, t), "list-type attributes need Kubernetes 1.36+ (DRAListTypeAttributes)")
    present = [t for t in present if t in allowed]
    if not present:
        errs.required(path, "exactly one value must be specified (one of " + ", ".join(allowed) + ")")
        return 0, False
    if len(present) > 1:
        errs.invalid(path, sorted(present), "exactly one value must be specified")
        return 0, False
    kind = present[0]
    raw = attr[kind]
    vpath = child(path, kind)
    if kind in _LIST_ATTRIBUTE_TYPES:
        items = _list(errs, raw, vpath)
        if not items:
            errs.required(vpath, "a list attribute must hold at least one value")
        for i, item in enumerate(items):
            _check_scalar(errs, kind[:-1], item, index(vpath, i), limits)
        return len(items), True
    _check_scalar(errs, kind, raw, vpath, limits)
    return 1, False


def _check_scalar(errs: _Errors, kind: str, raw: object, path: str, limits: Limits) -> None:
    if kind == "int":
        _int(errs, raw, path)
    elif kind == "bool":
        _bool(errs, raw, path)
    else:
        text = _str(errs, raw, path)
        if text is None:
            return
        if len(text) > limits.max_string_attribute:
            errs.too_long(path, limits.max_string_attribute)
        elif kind == "version" and not is_semver(text):
            errs.invalid(path, text, "must be a string compatible with semver.org spec 2.0.0")


def _check_capacity(
    errs: _Errors, value: object, path: str, *, multi_alloc: bool, limits: Limits
) -> None:
    cap = _map(errs, value, path)
    _check_quantity(errs, cap.get("value"), child(path, "value"))
    policy = cap.get("requestPolicy")
    if policy is None:
        return
    ppath = child(path, "requestPolicy")
    if not multi_alloc:
        errs.forbidden(ppath, "allowed only when allowMultipleAllocations is true")
        return
    p = _map(errs, policy, ppath)
    default = None
    if p.get("default") is not None:
        default = _check_quantity(errs, p.get("default"), child(ppath, "default"))
    has_values = p.get("validValues") is not None
    has_range = p.get("validRange") is not None
    if has_values and has_range:
        errs.forbidden(ppath, "exactly one policy can be specified: validValues or validRange")
    if has_values:
        vpath = child(ppath, "validValues")
        values = _list(errs, p.get("validValues"), vpath)
        _check_count(errs, values, vpath, limits.max_valid_values)
        parsed: list[Fraction] = []
        for i, v in enumerate(values):
            q = _check_quantity(errs, v, index(vpath, i))
            if q is not None:
                if parsed and q <= parsed[-1]:
                    errs.invalid(index(vpath, i), v, "values must be sorted in ascending order and unique")
                parsed.append(q)
        if default is not None and parsed and default not in parsed:
            errs.invalid(child(ppath, "default"), p.get("default"), "default value must be one of validValues")
    if has_range:
        rpath = child(ppath, "validRange")
        r = _map(errs, p.get("validRange"), rpath)
        lo = _check_quantity(errs, r.get("min"), child(rpath, "min"))
        hi = _check_quantity(errs, r.get("max"), child(rpath, "max")) if r.get("max") is not None else None
        step = _check_quantity(errs, r.get("step"), child(rpath, "step")) if r.get("step") is not None else None
        if lo is not None and hi is not None and hi < lo:
            errs.invalid(child(rpath, "max"), r.get("max"), "max must be greater than or equal to min")
        if step is not None and step <= 0:
            errs.invalid(child(rpath, "step"), r.get("step"), "step must be positive")
        if default is not None and lo is not None and (default < lo or (hi is not None and default > hi)):
            errs.invalid(child(ppath, "default"), p.get("default"), "default value must be within validRange")


def _check_counters(errs: _Errors, value: object, path: str, limit: int, *, required: bool) -> int:
    counters = _map(errs, value, path)
    if required and not counters:
        errs.required(path, "at least one counter, e.g. {memory: {value: 40Gi}}")
    if len(counters) > limit:
        errs.too_many(path, len(counters), limit)
    for name, counter in counters.items():
        cpath = key(path, name)
        for problem in dns_label_problems(name):
            errs.invalid(cpath, name, problem)
        _check_quantity(errs, _map(errs, counter, cpath).get("value"), child(cpath, "value"))
    return len(counters)


def _check_device(
    errs: _Errors, device: Mapping[str, Any], path: str, limits: Limits, *, per_device_nodes: bool
) -> tuple[bool, bool]:
    """Validate one device. Returns (uses taints or counters, uses list attributes)."""
    _check_dns_label(errs, device.get("name"), child(path, "name"))
    attrs = _map(errs, device.get("attributes"), child(path, "attributes"))
    caps = _map(errs, device.get("capacity"), child(path, "capacity"))
    combined = len(attrs) + len(caps)
    if combined > limits.max_attributes_and_capacities:
        errs.too_many(path, combined, limits.max_attributes_and_capacities, "attributes and capacities combined")
    values = 0
    uses_lists = False
    for name, value in attrs.items():
        apath = key(child(path, "attributes"), name)
        _check_attribute_name(errs, name, apath, limits, fully_qualified=False)
        count, is_list = _check_attribute_value(errs, value, apath, limits)
        values += count
        uses_lists = uses_lists or is_list
    if uses_lists and values > limits.max_attribute_values:
        errs.too_many(child(path, "attributes"), values, limits.max_attribute_values, "attribute values")
    multi = _bool(errs, device.get("allowMultipleAllocations"), child(path, "allowMultipleAllocations")) is True
    for name, value in caps.items():
        cpath = key(child(path, "capacity"), name)
        _check_attribute_name(errs, name, cpath, limits, fully_qualified=False)
        _check_capacity(errs, value, cpath, multi_alloc=multi, limits=limits)
    cc_path = child(path, "consumesCounters")
    consumes = _list(errs, device.get("consumesCounters"), cc_path)
    _check_count(errs, consumes, cc_path, limits.max_consumes_counters)
    seen_sets: set[str] = set()
    total = 0
    for i, entry in enumerate(consumes):
        epath = index(cc_path, i)
        e = _map(errs, entry, epath)
        set_name = _check_dns_label(errs, e.get("counterSet"), child(epath, "counterSet"))
        if set_name is not None:
            if set_name in seen_sets and limits.per_set_counter_limits:
                errs.duplicate(child(epath, "counterSet"), set_name)
            seen_sets.add(set_name)
        total += _check_counters(
            errs, e.get("counters"), child(epath, "counters"), limits.max_counters_per_consumption, required=True
        )
    if not limits.per_set_counter_limits and total > limits.max_counters_per_consumption:
        errs.too_many(cc_path, total, limits.max_counters_per_consumption, "counters")
    # Per-device node selection (partitionable devices): exactly one, and only with perDeviceNodeSelection.
    node_fields = [f for f in ("nodeName", "nodeSelector", "allNodes") if device.get(f) is not None]
    if per_device_nodes:
        _check_node_selection(errs, device, path, node_fields, single_term=True)
    else:
        for f in node_fields:
            errs.forbidden(child(path, f), "may only be set when spec.perDeviceNodeSelection is true")
    taints_path = child(path, "taints")
    taints = _list(errs, device.get("taints"), taints_path)
    _check_count(errs, taints, taints_path, limits.max_taints)
    for i, taint in enumerate(taints):
        _check_taint_like(errs, _map(errs, taint, index(taints_path, i)), index(taints_path, i), limits,
                          toleration=False)
    for cond_field in ("bindingConditions", "bindingFailureConditions"):
        cpath = child(path, cond_field)
        conds = _list(errs, device.get(cond_field), cpath)
        _check_count(errs, conds, cpath, limits.max_binding_conditions)
        for i, cond in enumerate(conds):
            _check_qualified_name(errs, cond, index(cpath, i))
    if device.get("bindingConditions") and not device.get("bindingFailureConditions"):
        errs.required(child(path, "bindingFailureConditions"), "required when bindingConditions is set")
    if device.get("bindingFailureConditions") and not device.get("bindingConditions"):
        errs.required(child(path, "bindingConditions"), "required when bindingFailureConditions is set")
    _bool(errs, device.get("bindsToNode"), child(path, "bindsToNode"))
    advanced = bool(taints) or bool(consumes)
    return advanced, uses_lists


def _check_node_selection(
    errs: _Errors, obj: Mapping[str, Any], path: str, present: list[str], *, single_term: bool,
    extra: Sequence[str] = ()
) -> None:
    for f in ("allNodes", *extra):
        if obj.get(f) is not None and _bool(errs, obj.get(f), child(path, f)) is False:
            errs.invalid(child(path, f), False, "must be either unset or set to true")
    names = ", ".join(f"`{f}`" for f in ("nodeName", "nodeSelector", "allNodes", *extra))
    if not present:
        errs.required(path, f"exactly one of {names} is required")
    elif len(present) > 1:
        errs.invalid(path, "{" + ", ".join(f"`{f}`" for f in present) + "}", f"exactly one of {names} is required")
    if obj.get("nodeName") is not None:
        node = _str(errs, obj.get("nodeName"), child(path, "nodeName"))
        if node is not None:
            for problem in dns_subdomain_problems(node):
                errs.invalid(child(path, "nodeName"), node, problem)
    if obj.get("nodeSelector") is not None:
        _check_node_selector(errs, obj.get("nodeSelector"), child(path, "nodeSelector"), single_term=single_term)


def validate_resource_slice_spec(spec_value: object, options: ValidationOptions = DEFAULT_OPTIONS,
                                 path: str = "spec") -> list[FieldError]:
    limits = options.limits
    errs = _Errors()
    if spec_value is None:
        errs.required(path)
        return errs.items
    spec = _map(errs, spec_value, path)
    _check_driver_name(errs, spec.get("driver"), child(path, "driver"), limits)
    pool_path = child(path, "pool")
    if spec.get("pool") is None:
        errs.required(pool_path)
    else:
        pool = _map(errs, spec.get("pool"), pool_path)
        name = _str(errs, pool.get("name"), child(pool_path, "name"))
        if not name:
            errs.required(child(pool_path, "name"), "one or more DNS subdomains separated by '/'")
        else:
            if len(name) > limits.max_pool_name:
                errs.too_long(child(pool_path, "name"), limits.max_pool_name)
            for segment in name.split("/"):
                if not _DNS_SUBDOMAIN_RE.fullmatch(segment):
                    errs.invalid(child(pool_path, "name"), name,
                                 "must be one or more DNS subdomains separated by '/': " + _DNS_SUBDOMAIN_MSG)
                    break
        generation = _int(errs, pool.get("generation"), child(pool_path, "generation"))
        if generation is not None and generation < 0:
            errs.invalid(child(pool_path, "generation"), generation, "must be greater than or equal to 0")
        count = _int(errs, pool.get("resourceSliceCount"), child(pool_path, "resourceSliceCount"))
        if count is None or count <= 0:
            errs.invalid(child(pool_path, "resourceSliceCount"), count if count is not None else 0,
                         "must be greater than zero")
    node_fields = [f for f in ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection")
                   if spec.get(f) is not None]
    _check_node_selection(errs, spec, path, node_fields, single_term=True, extra=("perDeviceNodeSelection",))
    per_device = spec.get("perDeviceNodeSelection") is True
    devices_path = child(path, "devices")
    devices = _list(errs, spec.get("devices"), devices_path)
    counters_path = child(path, "sharedCounters")
    shared = _list(errs, spec.get("sharedCounters"), counters_path)
    if limits.devices_xor_shared_counters and devices and shared:
        errs.invalid(path, "{`devices`, `sharedCounters`}",
                     "only one of `devices` or `sharedCounters` may be set; publish counter sets in their own "
                     "ResourceSlice of the same pool")
    advanced = False
    lists = False
    for i, dev in enumerate(devices):
        dpath = index(devices_path, i)
        adv, lst = _check_device(errs, _map(errs, dev, dpath), dpath, limits, per_device_nodes=per_device)
        advanced, lists = advanced or adv, lists or lst
    _check_unique_names(errs, devices, devices_path)
    limit = limits.max_devices_advanced if limits.advanced_device_cap and (advanced or lists) else limits.max_devices
    if len(devices) > limit:
        what = "items" if limit == limits.max_devices else (
            "items when any device has taints, consumesCounters or list attributes")
        errs.too_many(devices_path, len(devices), limit, what)
    if limits.per_set_counter_limits:
        _check_count(errs, shared, counters_path, limits.max_counter_sets)
    total = 0
    for i, cs in enumerate(shared):
        cpath = index(counters_path, i)
        c = _map(errs, cs, cpath)
        _check_dns_label(errs, c.get("name"), child(cpath, "name"))
        per_set = limits.max_counters_per_set if limits.per_set_counter_limits else 10**9
        total += _check_counters(errs, c.get("counters"), child(cpath, "counters"), per_set, required=True)
    if not limits.per_set_counter_limits and total > limits.max_counters_total_1_34:
        errs.too_many(counters_path, total, limits.max_counters_total_1_34, "counters")
    _check_unique_names(errs, shared, counters_path)
    return errs.items


def validate_resource_slice(obj: Mapping[str, Any], options: ValidationOptions = DEFAULT_OPTIONS) -> list[FieldError]:
    """A whole ResourceSlice: metadata (DNS-subdomain name) and spec."""
    errors = validate_object_meta(obj.get("metadata"), namespaced=False if _has_meta(obj) else None)
    return errors + validate_resource_slice_spec(obj.get("spec"), options)


def validate_resource_slice_update(
    new: Mapping[str, Any], old: Mapping[str, Any], options: ValidationOptions = DEFAULT_OPTIONS
) -> list[FieldError]:
    errors = validate_resource_slice(new, options)
    new_spec, old_spec = _spec(new), _spec(old)
    for path, a, b in (
        ("spec.driver", new_spec.get("driver"), old_spec.get("driver")),
        ("spec.pool.name", _spec_pool_name(new_spec), _spec_pool_name(old_spec)),
        ("spec.nodeName", new_spec.get("nodeName"), old_spec.get("nodeName")),
    ):
        if a != b:
            errors.append(FieldError(path, INVALID, "field is immutable", a))
    return errors


def _spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = obj.get("spec")
    return spec if isinstance(spec, Mapping) else {}


def _spec_pool_name(spec: Mapping[str, Any]) -> object:
    pool = spec.get("pool")
    return pool.get("name") if isinstance(pool, Mapping) else None


def _has_meta(obj: Mapping[str, Any]) -> bool:
    # Namespace checks only make sense for objects that came through the API (the sandbox fills
    # metadata.namespace from the URL); a builder's bare dict is validated without them.
    return isinstance(obj.get("metadata"), Mapping)


# ---------------------------------------------------------------------------------------------
# DeviceClass
# ---------------------------------------------------------------------------------------------


def validate_device_class(obj: Mapping[str, Any], options: ValidationOptions = DEFAULT_OPTIONS) -> list[FieldError]:
    limits = options.limits
    errs = _Errors()
    errs.items.extend(validate_object_meta(obj.get("metadata"), namespaced=False if _has_meta(obj) else None))
    spec = _map(errs, obj.get("spec"), "spec")
    _check_cel_selectors(errs, spec.get("selectors"), "spec.selectors", options)
    config = _list(errs, spec.get("config"), "spec.config")
    _check_count(errs, config, "spec.config", limits.max_config)
    for i, entry in enumerate(config):
        _check_opaque_config(errs, _map(errs, entry, index("spec.config", i)), index("spec.config", i), limits)
    ext = spec.get("extendedResourceName")
    if ext is not None:
        text = _str(errs, ext, "spec.extendedResourceName")
        if text is not None:
            problems = qualified_name_problems(text)
            domain = text.partition("/")[0] if "/" in text else ""
            if not domain:
                problems.append("must be a fully qualified extended resource name such as example.com/gpu")
            elif domain == "kubernetes.io" or domain.endswith(".kubernetes.io"):
                problems.append("must not use the kubernetes.io domain")
            if text.partition("/")[2].startswith("requests."):
                problems.append("must not start with 'requests.'")
            for problem in problems:
                errs.invalid("spec.extendedResourceName", text, problem)
    return errs.items


def validate_device_class_update(
    new: Mapping[str, Any], old: Mapping[str, Any], options: ValidationOptions = DEFAULT_OPTIONS
) -> list[FieldError]:
    del old  # DeviceClass specs are mutable.
    return validate_device_class(new, options)


# ---------------------------------------------------------------------------------------------
# ResourceClaim / ResourceClaimTemplate
# ---------------------------------------------------------------------------------------------

_ALLOCATION_MODES: Final = ("ExactCount", "All")


def _check_exact_request(
    errs: _Errors, req: Mapping[str, Any], path: str, options: ValidationOptions, *, sub: bool
) -> None:
    limits = options.limits
    _check_dns_subdomain(errs, req.get("deviceClassName"), child(path, "deviceClassName"))
    _check_cel_selectors(errs, req.get("selectors"), child(path, "selectors"), options)
    mode = req.get("allocationMode") or "ExactCount"
    count = _int(errs, req.get("count"), child(path, "count"))
    if mode not in _ALLOCATION_MODES:
        errs.not_supported(child(path, "allocationMode"), mode, _ALLOCATION_MODES)
    elif mode == "ExactCount" and count is not None and count <= 0:
        errs.invalid(child(path, "count"), count, "must be greater than zero")
    elif mode == "All" and count not in (None, 0):
        errs.invalid(child(path, "count"), count, "must not be specified when allocationMode is 'All'")
    if sub and req.get("adminAccess") is not None:
        errs.forbidden(child(path, "adminAccess"), "subrequests cannot request admin access")
    else:
        _bool(errs, req.get("adminAccess"), child(path, "adminAccess"))
    tol_path = child(path, "tolerations")
    tolerations = _list(errs, req.get("tolerations"), tol_path)
    _check_count(errs, tolerations, tol_path, limits.max_tolerations)
    for i, tol in enumerate(tolerations):
        _check_taint_like(errs, _map(errs, tol, index(tol_path, i)), index(tol_path, i), limits, toleration=True)
    if req.get("capacity") is not None:
        cap_path = child(child(path, "capacity"), "requests")
        requests = _map(errs, _map(errs, req.get("capacity"), child(path, "capacity")).get("requests"), cap_path)
        for name, quantity in requests.items():
            _check_attribute_name(errs, name, key(cap_path, name), limits, fully_qualified=False)
            _check_quantity(errs, quantity, key(cap_path, name))


def validate_claim_spec(spec_value: object, options: ValidationOptions = DEFAULT_OPTIONS,
                        path: str = "spec") -> list[FieldError]:
    """ResourceClaimSpec (also the inner spec of a ResourceClaimTemplate)."""
    limits = options.limits
    errs = _Errors()
    spec = _map(errs, spec_value, path)
    dpath = child(path, "devices")
    devices = _map(errs, spec.get("devices"), dpath)
    rpath = child(dpath, "requests")
    requests = _list(errs, devices.get("requests"), rpath)
    _check_count(errs, requests, rpath, limits.max_requests)
    known: dict[str, frozenset[str]] = {}
    for i, raw in enumerate(requests):
        path_i = index(rpath, i)
        req = _map(errs, raw, path_i)
        name = _check_dns_label(errs, req.get("name"), child(path_i, "name"))
        has_exact, has_first = req.get("exactly") is not None, req.get("firstAvailable") is not None
        subs: set[str] = set()
        if has_exact == has_first:
            detail = "exactly one of `exactly` or `firstAvailable` is required"
            if has_exact:
                errs.invalid(path_i, "{`exactly`, `firstAvailable`}", detail)
            else:
                errs.required(path_i, detail)
        elif has_exact:
            _check_exact_request(errs, _map(errs, req["exactly"], child(path_i, "exactly")),
                                 child(path_i, "exactly"), options, sub=False)
        else:
            fpath = child(path_i, "firstAvailable")
            firsts = _list(errs, req["firstAvailable"], fpath)
            if not firsts:
                errs.required(fpath, "at least one subrequest")
            _check_count(errs, firsts, fpath, limits.max_subrequests)
            for j, sraw in enumerate(firsts):
                spath = index(fpath, j)
                sreq = _map(errs, sraw, spath)
                sname = _check_dns_label(errs, sreq.get("name"), child(spath, "name"))
                if sname:
                    subs.add(sname)
                _check_exact_request(errs, sreq, spath, options, sub=True)
            _check_unique_names(errs, firsts, fpath)
        if name:
            known[name] = frozenset(subs)
    _check_unique_names(errs, requests, rpath)
    cpath = child(dpath, "constraints")
    constraints = _list(errs, devices.get("constraints"), cpath)
    _check_count(errs, constraints, cpath, limits.max_constraints)
    for i, raw in enumerate(constraints):
        path_i = index(cpath, i)
        con = _map(errs, raw, path_i)
        _check_request_refs(errs, con.get("requests"), child(path_i, "requests"), known)
        present = [f for f in ("matchAttribute", "distinctAttribute") if con.get(f) is not None]
        if len(present) != 1:
            detail = "exactly one of `matchAttribute` or `distinctAttribute` is required"
            if present:
                errs.invalid(path_i, "{`matchAttribute`, `distinctAttribute`}", detail)
            else:
                errs.required(path_i, detail)
        for f in present:
            text = _str(errs, con[f], child(path_i, f))
            if text is not None:
                _check_attribute_name(errs, text, child(path_i, f), limits, fully_qualified=True)
    cfg_path = child(dpath, "config")
    config = _list(errs, devices.get("config"), cfg_path)
    _check_count(errs, config, cfg_path, limits.max_config)
    for i, raw in enumerate(config):
        path_i = index(cfg_path, i)
        entry = _map(errs, raw, path_i)
        _check_request_refs(errs, entry.get("requests"), child(path_i, "requests"), known)
        _check_opaque_config(errs, entry, path_i, limits)
    return errs.items


def validate_resource_claim(obj: Mapping[str, Any], options: ValidationOptions = DEFAULT_OPTIONS) -> list[FieldError]:
    errors = validate_object_meta(obj.get("metadata"), namespaced=True if _namespace_known(obj) else None)
    errors += validate_claim_spec(obj.get("spec"), options)
    if obj.get("status") is not None:
        errors += validate_claim_status(obj.get("status"), obj.get("spec"), options)
    return errors


def _namespace_known(obj: Mapping[str, Any]) -> bool:
    meta = obj.get("metadata")
    return isinstance(meta, Mapping) and "namespace" in meta


def validate_resource_claim_update(
    new: Mapping[str, Any], old: Mapping[str, Any], options: ValidationOptions = DEFAULT_OPTIONS
) -> list[FieldError]:
    errors = validate_object_meta(new.get("metadata"), namespaced=True if _namespace_known(new) else None)
    errors += validate_claim_spec(new.get("spec"), options)
    if new.get("spec") != old.get("spec"):
        errors.append(FieldError("spec", INVALID, "field is immutable", _NO_VALUE))
    return errors


def validate_resource_claim_status_update(
    new: Mapping[str, Any], old: Mapping[str, Any], options: ValidationOptions = DEFAULT_OPTIONS
) -> list[FieldError]:
    """The /status subresource: shape and limits of status, plus the transitions the apiserver forbids."""
    errs = _Errors()
    status = _map(errs, new.get("status"), "status")
    old_status = old.get("status") if isinstance(old.get("status"), Mapping) else {}
    assert isinstance(old_status, Mapping)
    errs.items.extend(validate_claim_status(status, new.get("spec"), options))
    old_alloc, new_alloc = old_status.get("allocation"), status.get("allocation")
    if old_alloc is not None and new_alloc is not None and old_alloc != new_alloc:
        errs.invalid("status.allocation", _NO_VALUE, "field is immutable once set; clear it to deallocate")
    return errs.items


def validate_claim_status(
    status_value: object, spec_value: object, options: ValidationOptions = DEFAULT_OPTIONS
) -> list[FieldError]:
    limits = options.limits
    errs = _Errors()
    status = _map(errs, status_value, "status")
    allocated: set[tuple[str, str, str, str]] = set()
    alloc = status.get("allocation")
    requests = _claim_request_names(spec_value)
    if alloc is not None:
        apath = "status.allocation"
        a = _map(errs, alloc, apath)
        d = _map(errs, a.get("devices"), child(apath, "devices"))
        rpath = child(child(apath, "devices"), "results")
        results = _list(errs, d.get("results"), rpath)
        _check_count(errs, results, rpath, limits.max_allocation_results)
        for i, raw in enumerate(results):
            path_i = index(rpath, i)
            r = _map(errs, raw, path_i)
            req = _str(errs, r.get("request"), child(path_i, "request"))
            if not req:
                errs.required(child(path_i, "request"))
            elif requests is not None and req.partition("/")[0] not in requests:
                errs.invalid(child(path_i, "request"), req, "must be the name of a request in the claim or the "
                             "name of a request and a subrequest separated by '/'")
            driver = _check_driver_name(errs, r.get("driver"), child(path_i, "driver"), limits)
            pool = _str(errs, r.get("pool"), child(path_i, "pool"))
            if not pool:
                errs.required(child(path_i, "pool"))
            device = _check_dns_label(errs, r.get("device"), child(path_i, "device"))
            share = _str(errs, r.get("shareID"), child(path_i, "shareID")) or ""
            if driver and pool and device:
                allocated.add((driver, pool, device, share))
        cfg_path = child(child(apath, "devices"), "config")
        config = _list(errs, d.get("config"), cfg_path)
        _check_count(errs, config, cfg_path, limits.max_allocation_config)
        for i, raw in enumerate(config):
            path_i = index(cfg_path, i)
            entry = _map(errs, raw, path_i)
            if entry.get("source") not in ("FromClass", "FromClaim"):
                errs.not_supported(child(path_i, "source"), entry.get("source"), ["FromClass", "FromClaim"])
            _check_opaque_config(errs, entry, path_i, limits)
        if a.get("nodeSelector") is not None:
            _check_node_selector(errs, a.get("nodeSelector"), child(apath, "nodeSelector"), single_term=False)
    rf_path = "status.reservedFor"
    reserved = _list(errs, status.get("reservedFor"), rf_path)
    _check_count(errs, reserved, rf_path, limits.max_reserved_for)
    if reserved and alloc is None:
        errs.forbidden(rf_path, "may not be specified when `allocation` is not set")
    seen_uids: set[str] = set()
    for i, raw in enumerate(reserved):
        path_i = index(rf_path, i)
        r = _map(errs, raw, path_i)
        for f in ("resource", "name", "uid"):
            if not r.get(f):
                errs.required(child(path_i, f))
        uid = r.get("uid")
        if isinstance(uid, str) and uid:
            if uid in seen_uids:
                errs.duplicate(child(path_i, "uid"), uid)
            seen_uids.add(uid)
    dev_path = "status.devices"
    seen_devices: set[tuple[str, str, str, str]] = set()
    for i, raw in enumerate(_list(errs, status.get("devices"), dev_path)):
        path_i = index(dev_path, i)
        entry = _map(errs, raw, path_i)
        ident = (str(entry.get("driver") or ""), str(entry.get("pool") or ""), str(entry.get("device") or ""),
                 str(entry.get("shareID") or ""))
        for f in ("driver", "pool", "device"):
            if not entry.get(f):
                errs.required(child(path_i, f))
        if ident in seen_devices:
            errs.duplicate(path_i, "/".join(ident[:3]))
        seen_devices.add(ident)
        if ident not in allocated:
            errs.invalid(path_i, "/".join(p for p in ident if p),
                         "must be an allocated device in the claim (driver/pool/device[/shareID])")
        conds_path = child(path_i, "conditions")
        _check_count(errs, _list(errs, entry.get("conditions"), conds_path), conds_path,
                     limits.max_device_conditions)
        if entry.get("data") is not None:
            data = entry.get("data")
            if not isinstance(data, Mapping):
                errs.invalid(child(path_i, "data"), data, "must be a valid JSON object")
            elif len(json.dumps(data, separators=(",", ":"))) > limits.max_opaque_parameters:
                errs.too_long(child(path_i, "data"), limits.max_opaque_parameters)
        if entry.get("networkData") is not None:
            _check_network_data(errs, entry.get("networkData"), child(path_i, "networkData"), limits)
    return errs.items


def _claim_request_names(spec_value: object) -> set[str] | None:
    if not isinstance(spec_value, Mapping):
        return None
    devices = spec_value.get("devices")
    if not isinstance(devices, Mapping) or not isinstance(devices.get("requests"), list):
        return set()
    return {str(r["name"]) for r in devices["requests"] if isinstance(r, Mapping) and isinstance(r.get("name"), str)}


def _check_network_data(errs: _Errors, value: object, path: str, limits: Limits) -> None:
    nd = _map(errs, value, path)
    iface = _str(errs, nd.get("interfaceName"), child(path, "interfaceName"))
    if iface is not None and len(iface) > limits.max_interface_name:
        errs.too_long(child(path, "interfaceName"), limits.max_interface_name)
    hw = _str(errs, nd.get("hardwareAddress"), child(path, "hardwareAddress"))
    if hw is not None and len(hw) > limits.max_hardware_address:
        errs.too_long(child(path, "hardwareAddress"), limits.max_hardware_address)
    ips_path = child(path, "ips")
    ips = _list(errs, nd.get("ips"), ips_path)
    _check_count(errs, ips, ips_path, limits.max_network_ips)
    seen: set[str] = set()
    for i, ip in enumerate(ips):
        text = _str(errs, ip, index(ips_path, i))
        if text is None:
            continue
        try:
            ipaddress.ip_interface(text)
            if "/" not in text:
                raise ValueError(text)
        except ValueError:
            errs.invalid(index(ips_path, i), text, "must be a valid address in CIDR form, (e.g. 10.9.8.7/24 or "
                         "2001:db8::1/64)")
        if text in seen:
            errs.duplicate(index(ips_path, i), text)
        seen.add(text)


def validate_resource_claim_template(
    obj: Mapping[str, Any], options: ValidationOptions = DEFAULT_OPTIONS
) -> list[FieldError]:
    errs = _Errors()
    errs.items.extend(validate_object_meta(obj.get("metadata"), namespaced=True if _namespace_known(obj) else None))
    spec = _map(errs, obj.get("spec"), "spec")
    if spec.get("metadata") is not None:
        errs.items.extend(validate_object_meta(spec.get("metadata"), "spec.metadata", require_name=False))
    errs.items.extend(validate_claim_spec(spec.get("spec"), options, "spec.spec"))
    return errs.items


def validate_resource_claim_template_update(
    new: Mapping[str, Any], old: Mapping[str, Any], options: ValidationOptions = DEFAULT_OPTIONS
) -> list[FieldError]:
    errors = validate_resource_claim_template(new, options)
    if new.get("spec") != old.get("spec"):
        errors.append(FieldError("spec", INVALID, "field is immutable", _NO_VALUE))
    return errors


# ---------------------------------------------------------------------------------------------
# Known fields (for strict decoding and pruning, as the apiserver's typed decoder does)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Struct:
    fields: Mapping[str, Schema]
    # field -> first Kubernetes minor that knows it
    since: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class MapOf:
    values: Schema


@dataclass(frozen=True)
class ListOf:
    items: Schema


Schema = Struct | MapOf | ListOf | None  # None: a scalar or free-form JSON (RawExtension)

_NODE_SELECTOR_REQ: Final = Struct({"key": None, "operator": None, "values": None})
_NODE_SELECTOR: Final = Struct(
    {"nodeSelectorTerms": ListOf(Struct({"matchExpressions": ListOf(_NODE_SELECTOR_REQ),
                                         "matchFields": ListOf(_NODE_SELECTOR_REQ)}))}
)
_OWNER_REF: Final = Struct(
    {f: None for f in ("apiVersion", "kind", "name", "uid", "controller", "blockOwnerDeletion")}
)
OBJECT_META_SCHEMA: Final = Struct(
    {
        **{f: None for f in ("name", "generateName", "namespace", "selfLink", "uid", "resourceVersion",
                             "generation", "creationTimestamp", "deletionTimestamp",
                             "deletionGracePeriodSeconds", "finalizers", "managedFields")},
        "labels": MapOf(None),
        "annotations": MapOf(None),
        "ownerReferences": ListOf(_OWNER_REF),
    }
)
_COUNTERS: Final = MapOf(Struct({"value": None}))
_OPAQUE: Final = Struct({"opaque": Struct({"driver": None, "parameters": None})})
_SELECTORS: Final = ListOf(Struct({"cel": Struct({"expression": None})}))
_TOLERATIONS: Final = ListOf(Struct({f: None for f in ("key", "operator", "value", "effect", "tolerationSeconds")}))
_DEVICE: Final = Struct(
    {
        "name": None,
        "attributes": MapOf(Struct({f: None for f in _SCALAR_ATTRIBUTE_TYPES + _LIST_ATTRIBUTE_TYPES},
                                   since=dict.fromkeys(_LIST_ATTRIBUTE_TYPES, 36))),
        "capacity": MapOf(Struct({"value": None, "requestPolicy": Struct({
            "default": None, "validValues": None, "validRange": Struct({"min": None, "max": None, "step": None})})})),
        "consumesCounters": ListOf(Struct({"counterSet": None, "counters": _COUNTERS})),
        "nodeName": None,
        "nodeSelector": _NODE_SELECTOR,
        "allNodes": None,
        "taints": ListOf(Struct({f: None for f in ("key", "value", "effect", "timeAdded")})),
        "bindsToNode": None,
        "bindingConditions": None,
        "bindingFailureConditions": None,
        "allowMultipleAllocations": None,
        "nodeAllocatableResourceMappings": MapOf(Struct({"capacityKey": None, "allocationMultiplier": None})),
    },
    since={"nodeAllocatableResourceMappings": 36},
)
_SLICE: Final = Struct(
    {
        "apiVersion": None,
        "kind": None,
        "metadata": OBJECT_META_SCHEMA,
        "spec": Struct(
            {
                "driver": None,
                "pool": Struct({"name": None, "generation": None, "resourceSliceCount": None}),
                "nodeName": None,
                "nodeSelector": _NODE_SELECTOR,
                "allNodes": None,
                "devices": ListOf(_DEVICE),
                "perDeviceNodeSelection": None,
                "sharedCounters": ListOf(Struct({"name": None, "counters": _COUNTERS})),
            }
        ),
    }
)
_CLASS: Final = Struct(
    {
        "apiVersion": None,
        "kind": None,
        "metadata": OBJECT_META_SCHEMA,
        "spec": Struct({"selectors": _SELECTORS, "config": ListOf(_OPAQUE), "extendedResourceName": None}),
    }
)
_EXACT_FIELDS: Final[dict[str, Schema]] = {
    "deviceClassName": None,
    "selectors": _SELECTORS,
    "allocationMode": None,
    "count": None,
    "tolerations": _TOLERATIONS,
    "capacity": Struct({"requests": MapOf(None)}),
}
_CLAIM_SPEC: Final = Struct(
    {
        "devices": Struct(
            {
                "requests": ListOf(Struct({
                    "name": None,
                    "exactly": Struct({**_EXACT_FIELDS, "adminAccess": None}),
                    "firstAvailable": ListOf(Struct({"name": None, **_EXACT_FIELDS})),
                })),
                "constraints": ListOf(Struct({"requests": None, "matchAttribute": None, "distinctAttribute": None})),
                "config": ListOf(Struct({"requests": None, "opaque": Struct({"driver": None, "parameters": None})})),
            }
        )
    }
)
_CONDITION: Final = Struct(
    {f: None for f in ("type", "status", "observedGeneration", "lastTransitionTime", "reason", "message")}
)
_CLAIM_STATUS: Final = Struct(
    {
        "allocation": Struct(
            {
                "devices": Struct(
                    {
                        "results": ListOf(Struct({
                            **{f: None for f in ("request", "driver", "pool", "device", "adminAccess",
                                                 "bindingConditions", "bindingFailureConditions", "shareID")},
                            "tolerations": _TOLERATIONS,
                            "consumedCapacity": MapOf(None),
                        })),
                        "config": ListOf(Struct({"source": None, "requests": None,
                                                 "opaque": Struct({"driver": None, "parameters": None})})),
                    }
                ),
                "nodeSelector": _NODE_SELECTOR,
                "allocationTimestamp": None,
            }
        ),
        "reservedFor": ListOf(Struct({f: None for f in ("apiGroup", "resource", "name", "uid")})),
        "devices": ListOf(Struct({
            **{f: None for f in ("driver", "pool", "device", "data", "shareID")},
            "conditions": ListOf(_CONDITION),
            "networkData": Struct({"interfaceName": None, "ips": None, "hardwareAddress": None}),
        })),
    }
)
_CLAIM: Final = Struct(
    {"apiVersion": None, "kind": None, "metadata": OBJECT_META_SCHEMA, "spec": _CLAIM_SPEC, "status": _CLAIM_STATUS}
)
_TEMPLATE: Final = Struct(
    {
        "apiVersion": None,
        "kind": None,
        "metadata": OBJECT_META_SCHEMA,
        "spec": Struct({"metadata": OBJECT_META_SCHEMA, "spec": _CLAIM_SPEC}),
    }
)

SCHEMAS: Final[Mapping[str, Struct]] = {
    "ResourceSlice": _SLICE,
    "DeviceClass": _CLASS,
    "ResourceClaim": _CLAIM,
    "ResourceClaimTemplate": _TEMPLATE,
}


def unknown_fields(obj: Mapping[str, Any], kind: str | None = None,
                   options: ValidationOptions = DEFAULT_OPTIONS) -> list[str]:
    """Paths of fields the typed API does not declare (`spec.devices[0].atributes`), in document order."""
    return prune_unknown_fields(obj, kind, options)[1]


def prune_unknown_fields(
    obj: Mapping[str, Any], kind: str | None = None, options: ValidationOptions = DEFAULT_OPTIONS
) -> tuple[dict[str, Any], list[str]]:
    """A copy of `obj` without undeclared fields (the apiserver drops them while decoding), plus their paths."""
    schema = SCHEMAS.get(kind or str(obj.get("kind")))
    if schema is None:
        return dict(obj), []
    dropped: list[str] = []
    pruned = _prune(obj, schema, "", dropped, options.kube_version[1])
    assert isinstance(pruned, dict)
    return pruned, dropped


def _prune(value: Any, schema: Schema, path: str, dropped: list[str], minor: int) -> Any:
    if schema is None:
        return value
    if isinstance(schema, Struct) and isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for k, v in value.items():
            sub_path = child(path, k)
            if k not in schema.fields or schema.since.get(k, 0) > minor:
                dropped.append(sub_path)
                continue
            out[k] = _prune(v, schema.fields[k], sub_path, dropped, minor)
        return out
    if isinstance(schema, MapOf) and isinstance(value, Mapping):
        return {k: _prune(v, schema.values, key(path, k), dropped, minor) for k, v in value.items()}
    if isinstance(schema, ListOf) and isinstance(value, list):
        return [_prune(v, schema.items, index(path, i), dropped, minor) for i, v in enumerate(value)]
    return value  # wrong JSON type: left for the validators to report


# ---------------------------------------------------------------------------------------------
# Dispatch
# ---------------------------------------------------------------------------------------------

Validator = Callable[[Mapping[str, Any], ValidationOptions], list[FieldError]]
UpdateValidator = Callable[[Mapping[str, Any], Mapping[str, Any], ValidationOptions], list[FieldError]]

CREATE_VALIDATORS: Final[Mapping[str, Validator]] = {
    "ResourceSlice": validate_resource_slice,
    "DeviceClass": validate_device_class,
    "ResourceClaim": validate_resource_claim,
    "ResourceClaimTemplate": validate_resource_claim_template,
}
UPDATE_VALIDATORS: Final[Mapping[str, UpdateValidator]] = {
    "ResourceSlice": validate_resource_slice_update,
    "DeviceClass": validate_device_class_update,
    "ResourceClaim": validate_resource_claim_update,
    "ResourceClaimTemplate": validate_resource_claim_template_update,
}


def validate(obj: Mapping[str, Any], options: ValidationOptions = DEFAULT_OPTIONS) -> list[FieldError]:
    """Validate any resource.k8s.io/v1 object by its `kind`; other kinds get a clear error."""
    kind = obj.get("kind")
    validator = CREATE_VALIDATORS.get(str(kind))
    if validator is None:
        return [FieldError("kind", NOT_SUPPORTED, "supported values: " + ", ".join(CREATE_VALIDATORS), kind)]
    errors: list[FieldError] = []
    api_version = obj.get("apiVersion")
    if api_version not in (None, API_VERSION):
        errors.append(FieldError("apiVersion", NOT_SUPPORTED, f"supported values: {json.dumps(API_VERSION)}",
                                 api_version))
    return errors + validator(obj, options)
