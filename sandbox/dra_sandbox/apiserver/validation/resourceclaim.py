"""ResourceClaim (spec, status, the /status subresource) and ResourceClaimTemplate."""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Mapping
from typing import Any, Final

from dra_driver.k8s.names import dns_subdomain_problems

from .common import (
    as_bool,
    as_int,
    as_list,
    as_map,
    as_str,
    check_attribute_name,
    check_cel_selectors,
    check_count,
    check_dns_label,
    check_dns_subdomain,
    check_driver_name,
    check_exactly_one,
    check_node_selector,
    check_opaque_config,
    check_quantity,
    check_taint_like,
    check_unique_names,
    each_map,
)
from .fielderrors import INVALID, NO_VALUE, Errors, FieldError, Verbatim, child, index, key
from .meta import namespace_known, validate_conditions, validate_object_meta
from .options import DEFAULT_OPTIONS, Limits, ValidationOptions

_ALLOCATION_MODES: Final = ("ExactCount", "All")


def _check_exact_request(
    errs: Errors, req: Mapping[str, Any], path: str, options: ValidationOptions, *, sub: bool
) -> None:
    limits = options.limits
    check_dns_subdomain(errs, req.get("deviceClassName"), child(path, "deviceClassName"))
    check_cel_selectors(errs, req.get("selectors"), child(path, "selectors"), options)
    mode = req.get("allocationMode") or "ExactCount"
    count = as_int(errs, req.get("count"), child(path, "count"))
    if mode not in _ALLOCATION_MODES:
        errs.not_supported(child(path, "allocationMode"), mode, _ALLOCATION_MODES)
    elif mode == "ExactCount" and count is not None and count <= 0:
        errs.invalid(child(path, "count"), count, "must be greater than zero")
    elif mode == "All" and count not in (None, 0):
        errs.invalid(child(path, "count"), count, "must not be specified when allocationMode is 'All'")
    if sub and req.get("adminAccess") is not None:
        errs.forbidden(child(path, "adminAccess"), "subrequests cannot request admin access")
    else:
        as_bool(errs, req.get("adminAccess"), child(path, "adminAccess"))
    tol_path = child(path, "tolerations")
    tolerations = as_list(errs, req.get("tolerations"), tol_path)
    check_count(errs, tolerations, tol_path, limits.max_tolerations)
    for i, tol in enumerate(tolerations):
        check_taint_like(errs, as_map(errs, tol, index(tol_path, i)), index(tol_path, i), limits, toleration=True)
    if req.get("capacity") is not None:
        cap_path = child(child(path, "capacity"), "requests")
        requests = as_map(errs, as_map(errs, req.get("capacity"), child(path, "capacity")).get("requests"), cap_path)
        for name, quantity in requests.items():
            check_attribute_name(errs, name, key(cap_path, name), limits, fully_qualified=False)
            check_quantity(errs, quantity, key(cap_path, name))


def _check_request_refs(errs: Errors, value: object, path: str, known: Mapping[str, frozenset[str]]) -> None:
    refs = as_list(errs, value, path)
    seen: set[str] = set()
    for i, ref in enumerate(refs):
        ref_path = index(path, i)
        text = as_str(errs, ref, ref_path)
        if text is None:
            continue
        if text in seen:
            errs.duplicate(ref_path, text)
        seen.add(text)
        main, sep, sub = text.partition("/")
        if main not in known or (sep and sub not in known[main]):
            errs.invalid(ref_path, text, "must be the name of a request in the claim or the name of a request and "
                         "a subrequest separated by '/'")


def validate_claim_spec(spec_value: object, options: ValidationOptions = DEFAULT_OPTIONS,
                        path: str = "spec") -> list[FieldError]:
    """ResourceClaimSpec (also the inner spec of a ResourceClaimTemplate)."""
    limits = options.limits
    errs = Errors()
    spec = as_map(errs, spec_value, path)
    dpath = child(path, "devices")
    devices = as_map(errs, spec.get("devices"), dpath)
    rpath = child(dpath, "requests")
    requests = as_list(errs, devices.get("requests"), rpath)
    check_count(errs, requests, rpath, limits.max_requests)
    known: dict[str, frozenset[str]] = {}
    for i, raw in enumerate(requests):
        path_i = index(rpath, i)
        req = as_map(errs, raw, path_i)
        name = check_dns_label(errs, req.get("name"), child(path_i, "name"))
        kinds = [f for f in ("exactly", "firstAvailable") if req.get(f) is not None]
        check_exactly_one(errs, kinds, path_i, "exactly one of `exactly` or `firstAvailable` is required")
        subs: set[str] = set()
        if kinds == ["exactly"]:
            _check_exact_request(errs, as_map(errs, req["exactly"], child(path_i, "exactly")),
                                 child(path_i, "exactly"), options, sub=False)
        elif kinds == ["firstAvailable"]:
            fpath = child(path_i, "firstAvailable")
            firsts = as_list(errs, req["firstAvailable"], fpath)
            if not firsts:
                errs.required(fpath, "at least one subrequest")
            check_count(errs, firsts, fpath, limits.max_subrequests)
            for j, sraw in enumerate(firsts):
                spath = index(fpath, j)
                sreq = as_map(errs, sraw, spath)
                sname = check_dns_label(errs, sreq.get("name"), child(spath, "name"))
                if sname:
                    subs.add(sname)
                _check_exact_request(errs, sreq, spath, options, sub=True)
            check_unique_names(errs, firsts, fpath)
        if name:
            known[name] = frozenset(subs)
    check_unique_names(errs, requests, rpath)
    for path_i, con in each_map(errs, devices.get("constraints"), child(dpath, "constraints"), limits.max_constraints):
        _check_request_refs(errs, con.get("requests"), child(path_i, "requests"), known)
        present = [f for f in ("matchAttribute", "distinctAttribute") if con.get(f) is not None]
        check_exactly_one(errs, present, path_i, "exactly one of `matchAttribute` or `distinctAttribute` is required")
        for f in present:
            text = as_str(errs, con[f], child(path_i, f))
            if text is not None:
                check_attribute_name(errs, text, child(path_i, f), limits, fully_qualified=True)
    for path_i, entry in each_map(errs, devices.get("config"), child(dpath, "config"), limits.max_config):
        _check_request_refs(errs, entry.get("requests"), child(path_i, "requests"), known)
        check_opaque_config(errs, entry, path_i, limits)
    _check_derived_attributes(errs, requests, devices.get("constraints"), rpath, options)
    return errs.items


# resource.k8s.io/v1 DeviceDerivedAttributesMaxSize (1.37).
_MAX_DERIVED: Final = 32


def _constraint_attributes(constraints: object) -> dict[str, set[str]]:
    """Request reference ("" = every request, "req", "req/sub") -> the attributes constraints on it compare
    (gatherConstraintAttributes, k8s.io/kubernetes pkg/apis/resource/validation, 1.37)."""
    out: dict[str, set[str]] = {}
    for con in constraints if isinstance(constraints, list) else ():
        if not isinstance(con, Mapping):
            continue
        name = con.get("matchAttribute") or con.get("distinctAttribute")
        if not isinstance(name, str):
            continue
        refs = con.get("requests") if isinstance(con.get("requests"), list) else []
        for ref in refs or [""]:
            out.setdefault(str(ref), set()).add(name)
    return out


def _check_derived_attributes(
    errs: Errors, requests: list[Any], constraints: object, rpath: str, options: ValidationOptions
) -> None:
    """KEP-6080 `derivedAttributes` (present only while DRADerivedAttributes is on: the schema drops them
    otherwise): each a fully qualified, unique name that a matchAttribute/distinctAttribute constraint on its request
    compares, and an expression that compiles to a scalar or list of scalars within the cost limit."""
    used = _constraint_attributes(constraints)
    for i, raw in enumerate(requests):
        if not isinstance(raw, Mapping) or not isinstance(raw.get("name"), str):
            continue
        path_i = index(rpath, i)
        targets: list[tuple[str, str, object]] = []
        if isinstance(raw.get("exactly"), Mapping):
            targets.append((child(path_i, "exactly"), raw["name"], raw["exactly"].get("derivedAttributes")))
        for j, sub in enumerate(raw.get("firstAvailable") or []):
            if isinstance(sub, Mapping):
                targets.append((index(child(path_i, "firstAvailable"), j), f"{raw['name']}/{sub.get('name')}",
                                sub.get("derivedAttributes")))
        for path, ref, value in targets:
            if value is None:
                continue
            _check_derived_list(errs, value, child(path, "derivedAttributes"), ref, used, options)


def _check_derived_list(
    errs: Errors, value: object, path: str, ref: str, used: Mapping[str, set[str]], options: ValidationOptions
) -> None:
    parent = ref.partition("/")[0]
    referenced = used.get("", set()) | used.get(ref, set()) | used.get(parent, set())
    seen: set[str] = set()
    for item_path, item in each_map(errs, value, path, _MAX_DERIVED):
        name_path, expr_path = child(item_path, "name"), child(item_path, "expression")
        name = as_str(errs, item.get("name"), name_path)
        if not name:
            errs.required(name_path)
        else:
            check_attribute_name(errs, name, name_path, options.limits, fully_qualified=True)
            if name in seen:
                errs.duplicate(item_path, item)
            seen.add(name)
            if name not in referenced:
                errs.invalid(name_path, name, "must be referenced by at least one matchAttribute or "
                             "distinctAttribute constraint targeting this request")
        expression = as_str(errs, item.get("expression"), expr_path)
        if not expression:
            errs.required(expr_path)
        elif len(expression) > options.limits.max_cel_expression:
            errs.too_long(expr_path, options.limits.max_cel_expression)
        elif options.derived_check is not None:
            problem = options.derived_check(expression)
            if problem:
                errs.invalid(expr_path, expression, problem)


def validate_resource_claim(obj: Mapping[str, Any], options: ValidationOptions = DEFAULT_OPTIONS) -> list[FieldError]:
    errors = validate_object_meta(obj.get("metadata"), namespaced=True if namespace_known(obj) else None)
    errors += validate_claim_spec(obj.get("spec"), options)
    if obj.get("status") is not None:
        errors += validate_claim_status(obj.get("status"), obj.get("spec"), options)
    return errors


def validate_resource_claim_update(
    new: Mapping[str, Any], old: Mapping[str, Any], options: ValidationOptions = DEFAULT_OPTIONS
) -> list[FieldError]:
    errors = validate_object_meta(new.get("metadata"), namespaced=True if namespace_known(new) else None)
    errors += validate_claim_spec(new.get("spec"), options)
    if new.get("spec") != old.get("spec"):
        errors.append(FieldError("spec", INVALID, "field is immutable", NO_VALUE))
    return errors


def validate_resource_claim_status_update(
    new: Mapping[str, Any], old: Mapping[str, Any], options: ValidationOptions = DEFAULT_OPTIONS
) -> list[FieldError]:
    """The /status subresource: shape and limits of status, plus the transitions the apiserver forbids."""
    errs = Errors()
    status = as_map(errs, new.get("status"), "status")
    old_status = old.get("status") if isinstance(old.get("status"), Mapping) else {}
    assert isinstance(old_status, Mapping)
    errs.items.extend(validate_claim_status(status, new.get("spec"), options))
    old_alloc, new_alloc = old_status.get("allocation"), status.get("allocation")
    if old_alloc is not None and new_alloc is not None and old_alloc != new_alloc:
        errs.invalid("status.allocation", NO_VALUE, "field is immutable once set; clear it to deallocate")
    return errs.items


def validate_claim_status(
    status_value: object, spec_value: object, options: ValidationOptions = DEFAULT_OPTIONS
) -> list[FieldError]:
    limits = options.limits
    errs = Errors()
    status = as_map(errs, status_value, "status")
    allocated: set[tuple[str, str, str, str]] = set()
    alloc = status.get("allocation")
    requests = _claim_request_names(spec_value)
    if alloc is not None:
        apath = "status.allocation"
        a = as_map(errs, alloc, apath)
        d = as_map(errs, a.get("devices"), child(apath, "devices"))
        rpath = child(child(apath, "devices"), "results")
        for path_i, r in each_map(errs, d.get("results"), rpath, limits.max_allocation_results):
            req = as_str(errs, r.get("request"), child(path_i, "request"))
            if not req:
                errs.required(child(path_i, "request"))
            elif requests is not None and req.partition("/")[0] not in requests:
                errs.invalid(child(path_i, "request"), req, "must be the name of a request in the claim or the "
                             "name of a request and a subrequest separated by '/'")
            driver = check_driver_name(errs, r.get("driver"), child(path_i, "driver"), limits)
            pool = as_str(errs, r.get("pool"), child(path_i, "pool"))
            if not pool:
                errs.required(child(path_i, "pool"))
            device = check_dns_label(errs, r.get("device"), child(path_i, "device"))
            share = as_str(errs, r.get("shareID"), child(path_i, "shareID")) or ""
            if r.get("shareID") is not None:
                check_uid(errs, share, child(path_i, "shareID"))
            if driver and pool and device:
                allocated.add((driver, pool, device, share))
        cfg_path = child(child(apath, "devices"), "config")
        for path_i, entry in each_map(errs, d.get("config"), cfg_path, limits.max_allocation_config):
            if entry.get("source") not in ("FromClass", "FromClaim"):
                errs.not_supported(child(path_i, "source"), entry.get("source"), ["FromClass", "FromClaim"])
            check_opaque_config(errs, entry, path_i, limits)
        if a.get("nodeSelector") is not None:
            check_node_selector(errs, a.get("nodeSelector"), child(apath, "nodeSelector"), single_term=False)
    rf_path = "status.reservedFor"
    reserved = as_list(errs, status.get("reservedFor"), rf_path)
    check_count(errs, reserved, rf_path, limits.max_reserved_for)
    if reserved and alloc is None:
        # sic: upstream still names the field by its pre-v1 name (pkg/apis/resource/validation/validation.go)
        errs.forbidden(rf_path, "may not be specified when `allocated` is not set")
    seen_uids: set[str] = set()
    for i, raw in enumerate(reserved):
        path_i = index(rf_path, i)
        r = as_map(errs, raw, path_i)
        for f in ("resource", "name", "uid"):
            if not r.get(f):
                errs.required(child(path_i, f))
        uid = r.get("uid")
        if isinstance(uid, str) and uid:
            if uid in seen_uids:
                errs.duplicate(child(path_i, "uid"), uid)
            seen_uids.add(uid)
    _check_status_devices(errs, status.get("devices"), allocated, limits)
    return errs.items


# --- status.devices (KEP-4817): pkg/apis/resource/validation/validation.go validateDeviceStatus --------------

_HEX: Final = set("0123456789abcdefABCDEF")


def _uuid_problem(text: str) -> str | None:
    """github.com/google/uuid Validate, as the apiserver calls it (the error text it returns)."""
    body = text
    if len(text) == 45:
        if text[:9].lower() != "urn:uuid:":
            return f"invalid urn prefix: {json.dumps(text[:9])}"
        body = text[9:]
    elif len(text) == 38:
        if text[0] != "{" or text[-1] != "}":
            return "invalid bracketed UUID format"
        body = text[1:-1]
    elif len(text) == 32:
        return None if set(text) <= _HEX else "invalid UUID format"
    elif len(text) != 36:
        return f"invalid UUID length: {len(text)}"
    if any(body[i] != "-" for i in (8, 13, 18, 23)) or not set(body.replace("-", "")) <= _HEX or len(
            body.replace("-", "")) != 32:
        return "invalid UUID format"
    return None


def check_uid(errs: Errors, text: str, path: str) -> None:
    """validateUID: a UUID in RFC 4122 normalized (36-character, lower-case) form."""
    problem = _uuid_problem(text)
    if problem is not None:
        errs.invalid(path, text, f"error validating uid: {problem}")
    elif len(text) != 36 or text != text.lower():
        errs.invalid(path, text, "uid must be in RFC 4122 normalized form, `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` "
                     "with lowercase hexadecimal characters")


def _check_pool_name(errs: Errors, value: object, path: str, limits: Limits) -> str | None:
    """validatePoolName: required, at most 253 bytes, every '/'-separated part a DNS subdomain."""
    name = as_str(errs, value, path)
    if not name:
        errs.required(path)
        return None
    if len(name) > limits.max_pool_name:
        errs.too_long(path, limits.max_pool_name)
    for part in name.split("/"):
        for problem in dns_subdomain_problems(part):
            errs.invalid(path, part, problem)
    return name


def shared_device_id(driver: str, pool: str, device: str, share: str) -> str:
    """structured.SharedDeviceID.String(): `driver/pool/device`, then `/shareID` when there is one."""
    return f"{driver}/{pool}/{device}" + (f"/{share}" if share else "")


def _check_status_devices(
    errs: Errors, value: object, allocated: set[tuple[str, str, str, str]], limits: Limits
) -> None:
    """validateResourceClaimStatusUpdate's validateSet over status.devices (unique by driver/pool/device/shareID,
    no size limit) with validateDeviceStatus for each entry."""
    dev_path = "status.devices"
    seen: set[tuple[str, str, str, str]] = set()
    for i, raw in enumerate(as_list(errs, value, dev_path)):
        path_i = index(dev_path, i)
        entry = as_map(errs, raw, path_i)
        driver = check_driver_name(errs, entry.get("driver"), child(path_i, "driver"), limits) or ""
        pool = _check_pool_name(errs, entry.get("pool"), child(path_i, "pool"), limits) or ""
        device = check_dns_label(errs, entry.get("device"), child(path_i, "device")) or ""
        share = ""
        if entry.get("shareID") is not None:
            share = as_str(errs, entry.get("shareID"), child(path_i, "shareID")) or ""
            check_uid(errs, share, child(path_i, "shareID"))
        ident = (str(entry.get("driver") or ""), str(entry.get("pool") or ""), str(entry.get("device") or ""), share)
        if ident in seen:
            errs.duplicate(path_i, Verbatim(shared_device_id(*ident)))
        seen.add(ident)
        if (driver, pool, device, share) not in allocated:
            errs.invalid(path_i, Verbatim(shared_device_id(*ident)), "must be an allocated device in the claim")
        conds_path = child(path_i, "conditions")
        conditions = as_list(errs, entry.get("conditions"), conds_path)
        if len(conditions) > limits.max_device_conditions:
            errs.too_many(conds_path, len(conditions), limits.max_device_conditions)
        validate_conditions(errs, conditions, conds_path)
        if entry.get("data") is not None:
            data = entry.get("data")
            if not isinstance(data, Mapping):
                errs.invalid(child(path_i, "data"), "<value omitted>", "must be a valid JSON object")
            elif len(json.dumps(data, separators=(",", ":"))) > limits.max_opaque_parameters:
                errs.too_long(child(path_i, "data"), limits.max_opaque_parameters)
        if entry.get("networkData") is not None:
            _check_network_data(errs, entry.get("networkData"), child(path_i, "networkData"), limits)


def _claim_request_names(spec_value: object) -> set[str] | None:
    if not isinstance(spec_value, Mapping):
        return None
    devices = spec_value.get("devices")
    if not isinstance(devices, Mapping) or not isinstance(devices.get("requests"), list):
        return set()
    return {str(r["name"]) for r in devices["requests"] if isinstance(r, Mapping) and isinstance(r.get("name"), str)}


def _check_network_data(errs: Errors, value: object, path: str, limits: Limits) -> None:
    nd = as_map(errs, value, path)
    iface = as_str(errs, nd.get("interfaceName"), child(path, "interfaceName"))
    if iface is not None and len(iface) > limits.max_interface_name:
        errs.too_long(child(path, "interfaceName"), limits.max_interface_name)
    hw = as_str(errs, nd.get("hardwareAddress"), child(path, "hardwareAddress"))
    if hw is not None and len(hw) > limits.max_hardware_address:
        errs.too_long(child(path, "hardwareAddress"), limits.max_hardware_address)
    ips_path = child(path, "ips")
    ips = as_list(errs, nd.get("ips"), ips_path)
    check_count(errs, ips, ips_path, limits.max_network_ips)
    seen: set[str] = set()
    for i, ip in enumerate(ips):
        text = as_str(errs, ip, index(ips_path, i))
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
    errs = Errors()
    errs.items.extend(validate_object_meta(obj.get("metadata"), namespaced=True if namespace_known(obj) else None))
    spec = as_map(errs, obj.get("spec"), "spec")
    if spec.get("metadata") is not None:
        errs.items.extend(validate_object_meta(spec.get("metadata"), "spec.metadata", require_name=False))
    errs.items.extend(validate_claim_spec(spec.get("spec"), options, "spec.spec"))
    return errs.items


def validate_resource_claim_template_update(
    new: Mapping[str, Any], old: Mapping[str, Any], options: ValidationOptions = DEFAULT_OPTIONS
) -> list[FieldError]:
    errors = validate_resource_claim_template(new, options)
    if new.get("spec") != old.get("spec"):
        errors.append(FieldError("spec", INVALID, "field is immutable", NO_VALUE))
    return errors
