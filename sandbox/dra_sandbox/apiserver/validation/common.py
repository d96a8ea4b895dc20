"""Checks shared by several kinds: typed accessors, name, quantity, selector, config and taint checks.

Wrong JSON types become `FieldError`s, never exceptions: every check appends to an `Errors` and
carries on, so one answer lists every problem of an object.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence, Sized
from fractions import Fraction
from typing import Any, Final, TypeVar

from dra_driver.k8s.names import (
    C_IDENTIFIER_MSG,
    C_IDENTIFIER_RE,
    DNS_SUBDOMAIN_MAX,
    DNS_SUBDOMAIN_MSG,
    DNS_SUBDOMAIN_RE,
    dns_label_problems,
    label_value_problems,
    qualified_name_problems,
)
from dra_driver.k8s.quantity import parse_quantity as _parse_quantity

from .fielderrors import Errors, child, index
from .options import Limits, ValidationOptions

# ---------------------------------------------------------------------------------------------
# Value formats: semantic versions and quantities
# ---------------------------------------------------------------------------------------------

# Semantic Versioning 2.0.0 grammar (semver.org): numeric parts without leading zeros,
# optional pre-release and build metadata.
_SEMVER_RE: Final = re.compile(
    r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(-(0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(\.(0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*)?"
    r"(\+[0-9a-zA-Z-]+(\.[0-9a-zA-Z-]+)*)?"
)

T = TypeVar("T")


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
# Typed accessors: wrong JSON types become errors, never exceptions
# ---------------------------------------------------------------------------------------------


def as_map(errs: Errors, value: object, path: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if isinstance(value, Mapping):
        return value
    errs.type_invalid(path, value, "an object")
    return {}


def as_list(errs: Errors, value: object, path: str) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, list):
        return value
    errs.type_invalid(path, value, "a list")
    return []


def _as(errs: Errors, value: object, path: str, kind: type[T], what: str) -> T | None:
    """`value` where it is a `kind`; None where it is absent, and also (with an error saying `what` it must be)
    where it is something else."""
    if value is None:
        return None
    if isinstance(value, kind):
        return value
    errs.type_invalid(path, value, what)
    return None


def as_str(errs: Errors, value: object, path: str) -> str | None:
    return _as(errs, value, path, str, "a string")


def as_bool(errs: Errors, value: object, path: str) -> bool | None:
    return _as(errs, value, path, bool, "a boolean")


def as_int(errs: Errors, value: object, path: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63:
        return value
    errs.type_invalid(path, value, "a 64-bit integer")
    return None


# ---------------------------------------------------------------------------------------------
# Reusable field checks
# ---------------------------------------------------------------------------------------------


def _present(errs: Errors, value: object, path: str, required: bool) -> str | None:
    """The text at `path`; None (and, where `required`, an error) when it is missing or empty."""
    text = as_str(errs, value, path)
    if not text:
        if required:
            errs.required(path)
        return None
    return text


def _checked_name(errs: Errors, value: object, path: str, required: bool,
                  problems: Callable[[str], list[str]]) -> str | None:
    """The name at `path`, each of its `problems` reported."""
    text = _present(errs, value, path, required)
    if text is None:
        return None
    for problem in problems(text):
        errs.invalid(path, text, problem)
    return text


def check_dns_label(errs: Errors, value: object, path: str, *, required: bool = True) -> str | None:
    return _checked_name(errs, value, path, required, dns_label_problems)


def check_dns_subdomain(
    errs: Errors, value: object, path: str, *, max_len: int = DNS_SUBDOMAIN_MAX, required: bool = True
) -> str | None:
    text = _present(errs, value, path, required)
    if text is None:
        return None
    if len(text) > max_len:
        errs.too_long(path, max_len)
    if not DNS_SUBDOMAIN_RE.fullmatch(text):
        errs.invalid(path, text, DNS_SUBDOMAIN_MSG)
    return text


def check_qualified_name(errs: Errors, value: object, path: str, *, required: bool = True) -> str | None:
    return _checked_name(errs, value, path, required, qualified_name_problems)


def check_driver_name(errs: Errors, value: object, path: str, limits: Limits) -> str | None:
    return check_dns_subdomain(errs, value, path, max_len=limits.max_driver_name)


def check_quantity(errs: Errors, value: object, path: str) -> Fraction | None:
    if value is None or value == "":
        errs.required(path)
        return None
    try:
        return parse_quantity(value)
    except ValueError as exc:
        errs.invalid(path, value, str(exc))
        return None


def check_count(errs: Errors, items: Sized, path: str, limit: int, what: str = "items") -> None:
    if len(items) > limit:
        errs.too_many(path, len(items), limit, what)


def check_exactly_one(errs: Errors, present: Sequence[str], path: str, detail: str) -> None:
    """Upstream's check of a union whose members `present` are set: Required at `path` when none is, Invalid
    naming them when several are; `detail` is the wording of the validator at hand."""
    if not present:
        errs.required(path, detail)
    elif len(present) > 1:
        errs.invalid(path, "{" + ", ".join(f"`{f}`" for f in present) + "}", detail)


def each_map(errs: Errors, value: object, path: str, limit: int) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """(path, entry) for each entry of the list at `path`, each as a map; the list's type and length (at most
    `limit`) are checked first."""
    items = as_list(errs, value, path)
    check_count(errs, items, path, limit)
    for i, raw in enumerate(items):
        path_i = index(path, i)
        yield path_i, as_map(errs, raw, path_i)


def check_attribute_name(errs: Errors, name: str, path: str, limits: Limits, *, fully_qualified: bool) -> None:
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
        if not DNS_SUBDOMAIN_RE.fullmatch(domain):
            errs.invalid(path, domain, DNS_SUBDOMAIN_MSG)
    if not ident:
        errs.required(path, "the name after the domain must not be empty")
        return
    if len(ident) > limits.max_attribute_id:
        errs.too_long(path, limits.max_attribute_id)
    if not C_IDENTIFIER_RE.fullmatch(ident):
        errs.invalid(path, ident, C_IDENTIFIER_MSG)


def check_unique_names(errs: Errors, items: Sequence[Any], path: str, field_name: str = "name") -> None:
    seen: set[str] = set()
    for i, item in enumerate(items):
        if not isinstance(item, Mapping):
            continue
        name = item.get(field_name)
        if isinstance(name, str) and name:
            if name in seen:
                errs.duplicate(child(index(path, i), field_name), name)
            seen.add(name)


def check_cel_selectors(errs: Errors, value: object, path: str, options: ValidationOptions) -> None:
    limits = options.limits
    selectors = as_list(errs, value, path)
    check_count(errs, selectors, path, limits.max_selectors)
    for i, sel in enumerate(selectors):
        sel_path = index(path, i)
        sel_map = as_map(errs, sel, sel_path)
        cel = sel_map.get("cel")
        if cel is None:
            errs.required(child(sel_path, "cel"), "exactly one selector type must be set; use cel: {expression: ...}")
            continue
        expr_path = child(child(sel_path, "cel"), "expression")
        expr = as_str(errs, as_map(errs, cel, child(sel_path, "cel")).get("expression"), expr_path)
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


def check_opaque_config(errs: Errors, entry: Mapping[str, Any], path: str, limits: Limits) -> None:
    opaque = entry.get("opaque")
    opaque_path = child(path, "opaque")
    if opaque is None:
        errs.required(opaque_path, "exactly one configuration type must be set; use opaque: {driver, parameters}")
        return
    op = as_map(errs, opaque, opaque_path)
    check_driver_name(errs, op.get("driver"), child(opaque_path, "driver"), limits)
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


def check_node_selector(errs: Errors, value: object, path: str, *, single_term: bool) -> None:
    sel = as_map(errs, value, path)
    terms_path = child(path, "nodeSelectorTerms")
    terms = as_list(errs, sel.get("nodeSelectorTerms"), terms_path)
    if not terms:
        errs.required(terms_path, "must have at least one node selector term")
    elif single_term and len(terms) != 1:
        errs.invalid(terms_path, len(terms), "must have exactly one node selector term")
    for t, term in enumerate(terms):
        term_path = index(terms_path, t)
        term_map = as_map(errs, term, term_path)
        for list_name, key_check in (("matchExpressions", True), ("matchFields", False)):
            reqs_path = child(term_path, list_name)
            for r, req in enumerate(as_list(errs, term_map.get(list_name), reqs_path)):
                req_path = index(reqs_path, r)
                req_map = as_map(errs, req, req_path)
                if key_check:
                    check_qualified_name(errs, req_map.get("key"), child(req_path, "key"))
                elif req_map.get("key") != "metadata.name":
                    errs.invalid(child(req_path, "key"), req_map.get("key"), "only metadata.name is supported")
                op = req_map.get("operator")
                values = as_list(errs, req_map.get("values"), child(req_path, "values"))
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


def check_taint_like(
    errs: Errors, entry: Mapping[str, Any], path: str, limits: Limits, *, toleration: bool
) -> None:
    effects = ["NoSchedule", "NoExecute"] + (["None"] if limits.taint_effect_none else [])
    k = entry.get("key")
    if toleration:
        if k not in (None, ""):
            check_qualified_name(errs, k, child(path, "key"))
        op = entry.get("operator", "Equal") or "Equal"
        value = as_str(errs, entry.get("value"), child(path, "value")) or ""
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
        seconds = as_int(errs, entry.get("tolerationSeconds"), child(path, "tolerationSeconds"))
        if seconds is not None and effect != "NoExecute":
            errs.invalid(child(path, "effect"), effect, "effect must be 'NoExecute' when `tolerationSeconds` is set")
        return
    check_qualified_name(errs, k, child(path, "key"))
    value = as_str(errs, entry.get("value"), child(path, "value")) or ""
    for problem in label_value_problems(value):
        errs.invalid(child(path, "value"), value, problem)
    effect = entry.get("effect")
    if effect in (None, ""):
        errs.required(child(path, "effect"), "one of " + ", ".join(effects))
    elif effect not in effects:
        errs.not_supported(child(path, "effect"), effect, effects)
