"""DeviceTaintRule (KEP-5055): a device selector and one taint; status conditions written by the eviction controller.

Upstream: kubernetes/kubernetes `pkg/apis/resource/validation/validation.go` (`ValidateDeviceTaintRule`,
`validateDeviceTaintSelector`, `validateDeviceTaint`, `ValidateDeviceTaintRuleStatusUpdate`) and
staging/src/k8s.io/apimachinery `pkg/apis/meta/v1/validation/validation.go` (`ValidateConditions`). The selector's
fields are all optional and ANDed (driver: a driver name, pool: a pool name, device: a DNS label); the taint is
checked as a slice's taint is, except that `effect` is checked only when it changes (an update keeps an effect a
newer release stored). `deviceClassName` and `selectors` were removed from the selector in 1.35 (tombstoned), so
the decoder drops them like any unknown field.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from dra_driver.k8s.names import DNS_SUBDOMAIN_MSG, DNS_SUBDOMAIN_RE, label_value_problems, qualified_name_problems

from .common import as_map, as_str, check_count, check_dns_label, check_driver_name
from .fielderrors import Errors, FieldError, child
from .meta import has_meta, validate_conditions, validate_object_meta
from .options import DEFAULT_OPTIONS, ValidationOptions

EFFECTS: Final = ("NoExecute", "NoSchedule", "None")  # sets.List order: sorted
MAX_CONDITIONS: Final = 8  # resource.DeviceTaintRuleStatusMaxConditions
CONDITION_EVICTION_IN_PROGRESS: Final = "EvictionInProgress"


def _check_selector(errs: Errors, value: object, options: ValidationOptions) -> None:
    path = "spec.deviceSelector"
    if value is None:
        return  # no selector: the rule matches no device
    selector = as_map(errs, value, path)
    if selector.get("driver") is not None:
        check_driver_name(errs, selector.get("driver"), child(path, "driver"), options.limits)
    if selector.get("pool") is not None:
        pool = as_str(errs, selector.get("pool"), child(path, "pool"))
        if not pool:
            errs.required(child(path, "pool"), "one or more DNS subdomains separated by '/'")
        else:
            if len(pool) > options.limits.max_pool_name:
                errs.too_long(child(path, "pool"), options.limits.max_pool_name)
            if not all(DNS_SUBDOMAIN_RE.fullmatch(segment) for segment in pool.split("/")):
                errs.invalid(child(path, "pool"), pool,
                             "must be one or more DNS subdomains separated by '/': " + DNS_SUBDOMAIN_MSG)
    if selector.get("device") is not None:
        check_dns_label(errs, selector.get("device"), child(path, "device"))


def _check_taint(errs: Errors, value: object, old: Mapping[str, Any] | None) -> None:
    path = "spec.taint"
    taint = as_map(errs, value, path)
    key = as_str(errs, taint.get("key"), child(path, "key"))
    if not key:
        errs.required(child(path, "key"), "name part must be non-empty")
    else:
        for problem in qualified_name_problems(key):
            errs.invalid(child(path, "key"), key, problem)
    taint_value = as_str(errs, taint.get("value"), child(path, "value")) or ""
    for problem in label_value_problems(taint_value) if taint_value else ():
        errs.invalid(child(path, "value"), taint_value, problem)
    effect = taint.get("effect")
    if old is not None and old.get("effect") == effect:
        return
    if effect in (None, ""):
        errs.required(child(path, "effect"))
    elif effect not in EFFECTS:
        errs.not_supported(child(path, "effect"), effect, EFFECTS)


def _spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = obj.get("spec")
    return spec if isinstance(spec, Mapping) else {}


def validate_device_taint_rule(
    obj: Mapping[str, Any], options: ValidationOptions = DEFAULT_OPTIONS, *, old: Mapping[str, Any] | None = None
) -> list[FieldError]:
    errs = Errors()
    errs.items.extend(validate_object_meta(obj.get("metadata"), namespaced=False if has_meta(obj) else None))
    spec = as_map(errs, obj.get("spec"), "spec")
    _check_selector(errs, spec.get("deviceSelector"), options)
    old_taint = _spec(old).get("taint") if old is not None else None
    _check_taint(errs, spec.get("taint"), old_taint if isinstance(old_taint, Mapping) else None)
    return errs.items


def validate_device_taint_rule_update(
    new: Mapping[str, Any], old: Mapping[str, Any], options: ValidationOptions = DEFAULT_OPTIONS
) -> list[FieldError]:
    return validate_device_taint_rule(new, options, old=old)


def validate_device_taint_rule_status_update(
    new: Mapping[str, Any], old: Mapping[str, Any], options: ValidationOptions = DEFAULT_OPTIONS
) -> list[FieldError]:
    del old, options
    errs = Errors()
    status = as_map(errs, new.get("status"), "status")
    validate_conditions(errs, status.get("conditions"), "status.conditions")
    conditions = status.get("conditions")
    if isinstance(conditions, list):
        check_count(errs, conditions, "status.conditions", MAX_CONDITIONS)
    return errs.items
