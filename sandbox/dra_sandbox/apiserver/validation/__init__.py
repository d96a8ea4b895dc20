"""Validation of resource.k8s.io/v1 objects, following the kube-apiserver's rules, plus the admission glue.

Every check takes plain JSON-shaped values (what `json.loads` gives, camelCase keys) and returns a
list of `FieldError`s; nothing here does I/O or raises on bad input, so tests can check what the slice
builder is about to publish and the sandbox API server turns the list into a 422 `Invalid` Status
with one cause per error.

Rules come from docs/reference/kubernetes-dra.md §3 (types, oneOf rules, §3.6 limits). Version-dependent
rules follow `ValidationOptions.kube_version`; all DRA feature gates are treated as enabled, because
the driver is tested with partitionable devices, taints and consumable capacity switched on.

Modules, lowest first:

- `fielderrors`: `FieldError`, the cause types, field paths (`spec.devices[3].attributes[x]`), `Errors`.
- `options`: `ValidationOptions`, `Limits` and which limits each Kubernetes minor version applies.
- `common`: typed accessors and the checks several kinds share (names, quantities, CEL selectors,
  opaque config, node selectors, taints and tolerations). Generic Kubernetes name formats (DNS
  labels and subdomains, qualified names, label values) come from the product's `dra_driver.k8s.names`.
- `meta`: object metadata (name, namespace, labels, annotations, ownerReferences, finalizers).
- `resourceslice`, `deviceclass`, `resourceclaim` (also ResourceClaimTemplate): one kind each.
- `schema`: the fields each kind declares, for strict decoding and pruning.
- `dispatch`: `validate(obj)` and the create/update validator of each kind.
- `admission`: which checks the sandbox API server runs for which kind, and how failures become
  400/422 answers. It is not re-exported here: it needs the server's registry and errors, while the
  rest of this package is pure.
"""

from __future__ import annotations

from .common import is_quantity, is_semver, parse_quantity
from .deviceclass import validate_device_class, validate_device_class_update
from .dispatch import API_VERSION, CREATE_VALIDATORS, GROUP, UPDATE_VALIDATORS, UpdateValidator, Validator, validate
from .fielderrors import (
    DUPLICATE,
    FORBIDDEN,
    INVALID,
    NOT_SUPPORTED,
    REQUIRED,
    TOO_LONG,
    TOO_MANY,
    TYPE_INVALID,
    FieldError,
    format_errors,
)
from .meta import MAX_ANNOTATIONS_BYTES, NameCheck, validate_object_meta
from .options import DEFAULT_OPTIONS, CelCheck, Limits, ValidationOptions, limits_for, parse_kube_version
from .resourceclaim import (
    validate_claim_spec,
    validate_claim_status,
    validate_resource_claim,
    validate_resource_claim_status_update,
    validate_resource_claim_template,
    validate_resource_claim_template_update,
    validate_resource_claim_update,
)
from .resourceslice import validate_resource_slice, validate_resource_slice_spec, validate_resource_slice_update
from .schema import OBJECT_META_SCHEMA, SCHEMAS, prune_unknown_fields, unknown_fields

__all__ = [
    "API_VERSION",
    "CREATE_VALIDATORS",
    "DEFAULT_OPTIONS",
    "DUPLICATE",
    "FORBIDDEN",
    "GROUP",
    "INVALID",
    "MAX_ANNOTATIONS_BYTES",
    "NOT_SUPPORTED",
    "OBJECT_META_SCHEMA",
    "REQUIRED",
    "SCHEMAS",
    "TOO_LONG",
    "TOO_MANY",
    "TYPE_INVALID",
    "UPDATE_VALIDATORS",
    "CelCheck",
    "FieldError",
    "Limits",
    "NameCheck",
    "UpdateValidator",
    "ValidationOptions",
    "Validator",
    "format_errors",
    "is_quantity",
    "is_semver",
    "limits_for",
    "parse_kube_version",
    "parse_quantity",
    "prune_unknown_fields",
    "unknown_fields",
    "validate",
    "validate_claim_spec",
    "validate_claim_status",
    "validate_device_class",
    "validate_device_class_update",
    "validate_object_meta",
    "validate_resource_claim",
    "validate_resource_claim_status_update",
    "validate_resource_claim_template",
    "validate_resource_claim_template_update",
    "validate_resource_claim_update",
    "validate_resource_slice",
    "validate_resource_slice_spec",
    "validate_resource_slice_update",
]
