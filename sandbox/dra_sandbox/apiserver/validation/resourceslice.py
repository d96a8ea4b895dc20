"""ResourceSlice: devices, attributes, capacities, counters, node selection and the per-version limits."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any, Final

from dra_driver.k8s.names import DNS_SUBDOMAIN_MSG, DNS_SUBDOMAIN_RE, dns_label_problems, dns_subdomain_problems

from .common import (
    as_bool,
    as_int,
    as_list,
    as_map,
    as_str,
    check_attribute_name,
    check_count,
    check_dns_label,
    check_driver_name,
    check_exactly_one,
    check_node_selector,
    check_qualified_name,
    check_quantity,
    check_taint_like,
    check_unique_names,
    is_semver,
)
from .fielderrors import INVALID, Errors, FieldError, child, index, key
from .meta import has_meta, validate_object_meta
from .options import DEFAULT_OPTIONS, Limits, ValidationOptions

SCALAR_ATTRIBUTE_TYPES: Final = ("int", "bool", "string", "version")
LIST_ATTRIBUTE_TYPES: Final = ("ints", "bools", "strings", "versions")


def _check_attribute_value(
    errs: Errors, value: object, path: str, limits: Limits
) -> tuple[int, bool]:
    """Returns (number of values, is a list attribute)."""
    attr = as_map(errs, value, path)
    allowed = SCALAR_ATTRIBUTE_TYPES + (LIST_ATTRIBUTE_TYPES if limits.list_attributes else ())
    present = [t for t in SCALAR_ATTRIBUTE_TYPES + LIST_ATTRIBUTE_TYPES if attr.get(t) is not None]
    for t in present:
        if t not in allowed:
            errs.forbidden(child(path, t), "list-type attributes need Kubernetes 1.36+ with the DRAListTypeAttributes "
                                                 "feature gate (alpha, off by default)")
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
    if kind in LIST_ATTRIBUTE_TYPES:
        items = as_list(errs, raw, vpath)
        if not items:
            errs.required(vpath, "a list attribute must hold at least one value")
        for i, item in enumerate(items):
            _check_scalar(errs, kind[:-1], item, index(vpath, i), limits)
        return len(items), True
    _check_scalar(errs, kind, raw, vpath, limits)
    return 1, False


def _check_scalar(errs: Errors, kind: str, raw: object, path: str, limits: Limits) -> None:
    if kind == "int":
        as_int(errs, raw, path)
    elif kind == "bool":
        as_bool(errs, raw, path)
    else:
        text = as_str(errs, raw, path)
        if text is None:
            return
        if len(text) > limits.max_string_attribute:
            errs.too_long(path, limits.max_string_attribute)
        elif kind == "version" and not is_semver(text):
            errs.invalid(path, text, "must be a string compatible with semver.org spec 2.0.0")


def _int_value(q: Fraction) -> int:
    """resource.Quantity.Value(): the integer value, rounded up away from zero."""
    return math.ceil(q) if q >= 0 else math.floor(q)


def _check_capacity(
    errs: Errors, value: object, path: str, *, multi_alloc: bool, limits: Limits
) -> None:
    """`value`, and the requestPolicy rules of validateDeviceCapacity / validateRequestPolicy* (1.34+)."""
    cap = as_map(errs, value, path)
    capacity = check_quantity(errs, cap.get("value"), child(path, "value"))
    policy = cap.get("requestPolicy")
    if policy is None:
        return
    ppath = child(path, "requestPolicy")
    if not multi_alloc:
        errs.forbidden(ppath, "allowed only when allowMultipleAllocations is true")
        return
    p = as_map(errs, policy, ppath)
    default = None
    if p.get("default") is not None:
        default = check_quantity(errs, p.get("default"), child(ppath, "default"))
    has_values = bool(p.get("validValues"))
    has_range = p.get("validRange") is not None
    if has_values and has_range:
        errs.forbidden(ppath, 'exactly one policy can be specified, cannot specify "validValues" and "validRange" '
                       "at the same time")
        return
    if capacity is None:
        return
    if has_values:
        if p.get("default") is None:
            errs.required(child(ppath, "default"), "required when validValues is defined")
        elif default is not None:
            _check_valid_values(errs, p, default, capacity, child(ppath, "validValues"), limits)
    elif has_range:
        if p.get("default") is None:
            errs.required(child(ppath, "default"), "required when validRange is defined")
        elif default is not None:
            _check_valid_range(errs, p, default, capacity, child(ppath, "validRange"))


def _check_valid_values(
    errs: Errors, p: Mapping[str, Any], default: Fraction, capacity: Fraction, vpath: str, limits: Limits
) -> None:
    values = as_list(errs, p.get("validValues"), vpath)
    parsed: list[Fraction | None] = [check_quantity(errs, v, index(vpath, i)) for i, v in enumerate(values)]
    for i in range(len(parsed) - 1):
        a, b = parsed[i], parsed[i + 1]
        if a is not None and b is not None and a > b:
            errs.invalid(index(vpath, i + 1), values[i + 1], "values must be sorted in ascending order")
    check_count(errs, values, vpath, limits.max_valid_values)
    seen: set[Fraction] = set()
    for i, q in enumerate(parsed):
        if q is None:
            continue
        if q in seen:
            errs.duplicate(index(vpath, i), values[i])
        seen.add(q)
        if q > capacity:
            errs.invalid(index(vpath, i), values[i], "option is larger than capacity value")
    if default not in seen:
        errs.invalid(vpath, p.get("default"), "default value is not valid according to the requestPolicy")


def _check_valid_range(
    errs: Errors, p: Mapping[str, Any], default: Fraction, capacity: Fraction, rpath: str
) -> None:
    r = as_map(errs, p.get("validRange"), rpath)
    if r.get("min") is None:
        errs.required(child(rpath, "min"), "required when validRange is defined")
        return
    lo = check_quantity(errs, r.get("min"), child(rpath, "min"))
    if lo is None:
        return
    if lo > capacity:
        errs.invalid(child(rpath, "min"), r.get("min"), "min is larger than capacity value")
    if default < lo:
        errs.invalid(child(rpath, "min"), p.get("default"), f"default is less than min: {r.get('min')}")
    hi = check_quantity(errs, r.get("max"), child(rpath, "max")) if r.get("max") is not None else None
    if hi is not None:
        if lo > hi:
            errs.invalid(child(rpath, "max"), r.get("min"), f"min is larger than max: {r.get('max')}")
        if hi > capacity:
            errs.invalid(child(rpath, "max"), r.get("max"), "max is larger than capacity value")
        if default > hi:
            errs.invalid(child(rpath, "max"), p.get("default"), f"default is more than max: {r.get('max')}")
    if r.get("step") is None:
        return
    step = check_quantity(errs, r.get("step"), child(rpath, "step"))
    if step is None:
        return
    spath = child(rpath, "step")
    if lo + step > capacity:
        errs.invalid(spath, r.get("step"), "one step (min + step) is larger than capacity value")
    step_value = _int_value(step)
    if step_value <= 0:  # upstream would divide by zero; a real server never gets this far with a useful object
        errs.invalid(spath, r.get("step"), "step must be positive")
        return
    checks = [(default, p.get("default"))] + ([(hi, r.get("max"))] if hi is not None else [])
    for amount, raw in checks:
        if (_int_value(amount) - _int_value(lo)) % step_value != 0:
            errs.invalid(spath, raw, f"value is not a multiple of a given step ({r.get('step')}) from ({r.get('min')})")


def _check_counters(errs: Errors, value: object, path: str, limit: int, *, required: bool) -> int:
    counters = as_map(errs, value, path)
    if required and not counters:
        errs.required(path, "at least one counter, e.g. {memory: {value: 40Gi}}")
    if len(counters) > limit:
        errs.too_many(path, len(counters), limit)
    for name, counter in counters.items():
        cpath = key(path, name)
        for problem in dns_label_problems(name):
            errs.invalid(cpath, name, problem)
        check_quantity(errs, as_map(errs, counter, cpath).get("value"), child(cpath, "value"))
    return len(counters)


def _check_device(
    errs: Errors, device: Mapping[str, Any], path: str, limits: Limits, *, per_device_nodes: bool
) -> tuple[bool, bool]:
    """Validate one device. Returns (uses taints or counters, uses list attributes)."""
    check_dns_label(errs, device.get("name"), child(path, "name"))
    attrs = as_map(errs, device.get("attributes"), child(path, "attributes"))
    caps = as_map(errs, device.get("capacity"), child(path, "capacity"))
    combined = len(attrs) + len(caps)
    if combined > limits.max_attributes_and_capacities:
        errs.too_many(path, combined, limits.max_attributes_and_capacities, "attributes and capacities combined")
    values = 0
    uses_lists = False
    for name, value in attrs.items():
        apath = key(child(path, "attributes"), name)
        check_attribute_name(errs, name, apath, limits, fully_qualified=False)
        count, is_list = _check_attribute_value(errs, value, apath, limits)
        values += count
        uses_lists = uses_lists or is_list
    if uses_lists and values > limits.max_attribute_values:
        errs.too_many(child(path, "attributes"), values, limits.max_attribute_values, "attribute values")
    multi = as_bool(errs, device.get("allowMultipleAllocations"), child(path, "allowMultipleAllocations")) is True
    for name, value in caps.items():
        cpath = key(child(path, "capacity"), name)
        check_attribute_name(errs, name, cpath, limits, fully_qualified=False)
        _check_capacity(errs, value, cpath, multi_alloc=multi, limits=limits)
    cc_path = child(path, "consumesCounters")
    consumes = as_list(errs, device.get("consumesCounters"), cc_path)
    check_count(errs, consumes, cc_path, limits.max_consumes_counters)
    seen_sets: set[str] = set()
    total = 0
    for i, entry in enumerate(consumes):
        epath = index(cc_path, i)
        e = as_map(errs, entry, epath)
        set_name = check_dns_label(errs, e.get("counterSet"), child(epath, "counterSet"))
        if set_name is not None:
            if set_name in seen_sets and limits.per_set_counter_limits:
                errs.duplicate(child(epath, "counterSet"), set_name)
            seen_sets.add(set_name)
        total += _check_counters(
            errs, e.get("counters"), child(epath, "counters"), limits.max_counters_per_consumption, required=True
        )
        # KEP-5963 (1.37, only while DRADeviceCompatibilityGroups is on: the schema drops it otherwise): at most 2
        # unique DNS labels (DeviceCompatibilityGroupsMaxSize).
        gpath = child(epath, "compatibilityGroups")
        groups = as_list(errs, e.get("compatibilityGroups"), gpath)
        check_count(errs, groups, gpath, 2)
        seen_groups: set[str] = set()
        for j, group in enumerate(groups):
            group_name = check_dns_label(errs, group, index(gpath, j))
            if group_name is not None and group_name in seen_groups:
                errs.duplicate(index(gpath, j), group_name)
            seen_groups.add(group_name or "")
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
    taints = as_list(errs, device.get("taints"), taints_path)
    check_count(errs, taints, taints_path, limits.max_taints)
    for i, taint in enumerate(taints):
        check_taint_like(errs, as_map(errs, taint, index(taints_path, i)), index(taints_path, i), limits,
                          toleration=False)
    for cond_field in ("bindingConditions", "bindingFailureConditions"):
        cpath = child(path, cond_field)
        conds = as_list(errs, device.get(cond_field), cpath)
        check_count(errs, conds, cpath, limits.max_binding_conditions)
        for i, cond in enumerate(conds):
            check_qualified_name(errs, cond, index(cpath, i))
    if device.get("bindingConditions") and not device.get("bindingFailureConditions"):
        errs.required(child(path, "bindingFailureConditions"), "required when bindingConditions is set")
    if device.get("bindingFailureConditions") and not device.get("bindingConditions"):
        errs.required(child(path, "bindingConditions"), "required when bindingFailureConditions is set")
    as_bool(errs, device.get("bindsToNode"), child(path, "bindsToNode"))
    advanced = bool(taints) or bool(consumes)
    return advanced, uses_lists


def _check_node_selection(
    errs: Errors, obj: Mapping[str, Any], path: str, present: list[str], *, single_term: bool,
    extra: Sequence[str] = ()
) -> None:
    for f in ("allNodes", *extra):
        if obj.get(f) is not None and as_bool(errs, obj.get(f), child(path, f)) is False:
            errs.invalid(child(path, f), False, "must be either unset or set to true")
    names = ", ".join(f"`{f}`" for f in ("nodeName", "nodeSelector", "allNodes", *extra))
    check_exactly_one(errs, present, path, f"exactly one of {names} is required")
    if obj.get("nodeName") is not None:
        node = as_str(errs, obj.get("nodeName"), child(path, "nodeName"))
        if node is not None:
            for problem in dns_subdomain_problems(node):
                errs.invalid(child(path, "nodeName"), node, problem)
    if obj.get("nodeSelector") is not None:
        check_node_selector(errs, obj.get("nodeSelector"), child(path, "nodeSelector"), single_term=single_term)


def validate_resource_slice_spec(spec_value: object, options: ValidationOptions = DEFAULT_OPTIONS,
                                 path: str = "spec") -> list[FieldError]:
    limits = options.limits
    errs = Errors()
    if spec_value is None:
        errs.required(path)
        return errs.items
    spec = as_map(errs, spec_value, path)
    check_driver_name(errs, spec.get("driver"), child(path, "driver"), limits)
    pool_path = child(path, "pool")
    if spec.get("pool") is None:
        errs.required(pool_path)
    else:
        pool = as_map(errs, spec.get("pool"), pool_path)
        name = as_str(errs, pool.get("name"), child(pool_path, "name"))
        if not name:
            errs.required(child(pool_path, "name"), "one or more DNS subdomains separated by '/'")
        else:
            if len(name) > limits.max_pool_name:
                errs.too_long(child(pool_path, "name"), limits.max_pool_name)
            for segment in name.split("/"):
                if not DNS_SUBDOMAIN_RE.fullmatch(segment):
                    errs.invalid(child(pool_path, "name"), name,
                                 "must be one or more DNS subdomains separated by '/': " + DNS_SUBDOMAIN_MSG)
                    break
        generation = as_int(errs, pool.get("generation"), child(pool_path, "generation"))
        if generation is not None and generation < 0:
            errs.invalid(child(pool_path, "generation"), generation, "must be greater than or equal to 0")
        count = as_int(errs, pool.get("resourceSliceCount"), child(pool_path, "resourceSliceCount"))
        if count is None or count <= 0:
            errs.invalid(child(pool_path, "resourceSliceCount"), count if count is not None else 0,
                         "must be greater than zero")
    node_fields = [f for f in ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection")
                   if spec.get(f) is not None]
    _check_node_selection(errs, spec, path, node_fields, single_term=True, extra=("perDeviceNodeSelection",))
    per_device = spec.get("perDeviceNodeSelection") is True
    devices_path = child(path, "devices")
    devices = as_list(errs, spec.get("devices"), devices_path)
    counters_path = child(path, "sharedCounters")
    shared = as_list(errs, spec.get("sharedCounters"), counters_path)
    if limits.devices_xor_shared_counters and devices and shared:
        errs.invalid(path, "{`devices`, `sharedCounters`}",
                     "only one of `devices` or `sharedCounters` may be set; publish counter sets in their own "
                     "ResourceSlice of the same pool")
    advanced = False
    lists = False
    for i, dev in enumerate(devices):
        dpath = index(devices_path, i)
        adv, lst = _check_device(errs, as_map(errs, dev, dpath), dpath, limits, per_device_nodes=per_device)
        advanced, lists = advanced or adv, lists or lst
    check_unique_names(errs, devices, devices_path)
    limit = limits.max_devices_advanced if limits.advanced_device_cap and (advanced or lists) else limits.max_devices
    if len(devices) > limit:
        what = "items" if limit == limits.max_devices else (
            "items when any device has taints, consumesCounters or list attributes")
        errs.too_many(devices_path, len(devices), limit, what)
    if limits.per_set_counter_limits:
        check_count(errs, shared, counters_path, limits.max_counter_sets)
    total = 0
    for i, cs in enumerate(shared):
        cpath = index(counters_path, i)
        c = as_map(errs, cs, cpath)
        check_dns_label(errs, c.get("name"), child(cpath, "name"))
        per_set = limits.max_counters_per_set if limits.per_set_counter_limits else 10**9
        total += _check_counters(errs, c.get("counters"), child(cpath, "counters"), per_set, required=True)
    if not limits.per_set_counter_limits and total > limits.max_counters_total_1_34:
        errs.too_many(counters_path, total, limits.max_counters_total_1_34, "counters")
    check_unique_names(errs, shared, counters_path)
    if spec.get("partitionTypeAttribute") is not None:
        _check_partition_type_attribute(errs, spec, path, devices, limits)
    return errs.items


def _check_partition_type_attribute(errs: Errors, spec: Mapping[str, Any], path: str, devices: list[Any],
                                    limits: Limits) -> None:
    """KEP-5677 (1.37, kept only with DRAPartitionableDevicesType: the schema drops it otherwise): a fully qualified
    name, only on a slice with a counter-consuming device, each of which carries that attribute (fully qualified, or
    bare in the driver's domain) as a string (1.37.2 validatePartitionTypeAttribute)."""
    fpath = child(path, "partitionTypeAttribute")
    name = spec.get("partitionTypeAttribute")
    if not isinstance(name, str):
        errs.invalid(fpath, name, "must be a string")
        return
    named = Errors()  # the declarative check of the name, reported whatever else is wrong
    check_attribute_name(named, name, fpath, limits, fully_qualified=True)
    errs.items.extend(named.items)
    consuming = [(i, d) for i, d in enumerate(devices) if isinstance(d, dict) and d.get("consumesCounters")]
    if not consuming:
        errs.invalid(fpath, name, "may only be set on a slice which declares devices that consume counters")
        return
    if named.items:  # no device can carry a malformed name: one error, not one per device
        return
    driver = spec.get("driver")
    bare = name.removeprefix(f"{driver}/") if isinstance(driver, str) and name.startswith(f"{driver}/") else ""
    for i, device in consuming:
        raw = device.get("attributes")
        attrs: Mapping[str, Any] = raw if isinstance(raw, dict) else {}
        attribute = attrs.get(name, attrs.get(bare) if bare else None)
        apath = key(child(index(child(path, "devices"), i), "attributes"), name)
        if attribute is None:
            errs.required(apath, "device consumes counters and `partitionTypeAttribute` names this attribute, so it "
                                 "must be set")
        elif not isinstance(attribute, dict) or not isinstance(attribute.get("string"), str):
            errs.invalid(apath, attribute, "must be a string value because `partitionTypeAttribute` names this "
                                           "attribute")


def validate_resource_slice(obj: Mapping[str, Any], options: ValidationOptions = DEFAULT_OPTIONS) -> list[FieldError]:
    """A whole ResourceSlice: metadata (DNS-subdomain name) and spec."""
    errors = validate_object_meta(obj.get("metadata"), namespaced=False if has_meta(obj) else None)
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
