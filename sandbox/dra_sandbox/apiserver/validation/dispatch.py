"""Validation by `kind`: the create and update validator of each resource.k8s.io/v1 kind."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, Final

from .deviceclass import validate_device_class, validate_device_class_update
from .devicetaintrule import validate_device_taint_rule, validate_device_taint_rule_update
from .fielderrors import NOT_SUPPORTED, FieldError
from .options import DEFAULT_OPTIONS, ValidationOptions
from .resourceclaim import (
    validate_resource_claim,
    validate_resource_claim_template,
    validate_resource_claim_template_update,
    validate_resource_claim_update,
)
from .resourceslice import validate_resource_slice, validate_resource_slice_update

GROUP: Final = "resource.k8s.io"
API_VERSION: Final = "resource.k8s.io/v1"

Validator = Callable[[Mapping[str, Any], ValidationOptions], list[FieldError]]
UpdateValidator = Callable[[Mapping[str, Any], Mapping[str, Any], ValidationOptions], list[FieldError]]

CREATE_VALIDATORS: Final[Mapping[str, Validator]] = {
    "ResourceSlice": validate_resource_slice,
    "DeviceClass": validate_device_class,
    "ResourceClaim": validate_resource_claim,
    "ResourceClaimTemplate": validate_resource_claim_template,
    "DeviceTaintRule": validate_device_taint_rule,
}
UPDATE_VALIDATORS: Final[Mapping[str, UpdateValidator]] = {
    "ResourceSlice": validate_resource_slice_update,
    "DeviceClass": validate_device_class_update,
    "ResourceClaim": validate_resource_claim_update,
    "ResourceClaimTemplate": validate_resource_claim_template_update,
    "DeviceTaintRule": validate_device_taint_rule_update,
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
