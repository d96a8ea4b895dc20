"""DeviceClass: selectors, opaque config and the extended resource name."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dra_driver.k8s.names import qualified_name_problems

from .common import as_list, as_map, as_str, check_cel_selectors, check_count, check_opaque_config
from .fielderrors import Errors, FieldError, index
from .meta import has_meta, validate_object_meta
from .options import DEFAULT_OPTIONS, ValidationOptions


def validate_device_class(obj: Mapping[str, Any], options: ValidationOptions = DEFAULT_OPTIONS) -> list[FieldError]:
    limits = options.limits
    errs = Errors()
    errs.items.extend(validate_object_meta(obj.get("metadata"), namespaced=False if has_meta(obj) else None))
    spec = as_map(errs, obj.get("spec"), "spec")
    check_cel_selectors(errs, spec.get("selectors"), "spec.selectors", options)
    config = as_list(errs, spec.get("config"), "spec.config")
    check_count(errs, config, "spec.config", limits.max_config)
    for i, entry in enumerate(config):
        check_opaque_config(errs, as_map(errs, entry, index("spec.config", i)), index("spec.config", i), limits)
    ext = spec.get("extendedResourceName")
    if ext is not None:
        text = as_str(errs, ext, "spec.extendedResourceName")
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
