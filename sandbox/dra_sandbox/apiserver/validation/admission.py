"""Admission glue: which checks run for which kind, and how failures become 400/422 answers.

resource.k8s.io kinds get the full rule book of this package and typed-field pruning; CRDs get
their structural checks; every other kind gets metadata checks only (name format, labels,
annotations, ownerReferences), which is all the sandbox promises for them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from dra_driver.k8s.names import dns_label_problems, dns_subdomain_problems, path_segment_name_problems

from .. import crschema, errors, quantities
from ..crds import validate_crd
from ..kinds import (
    CRD_KEY,
    DAEMONSET_KEY,
    EVENT_KEY,
    LEASE_KEY,
    POD_GROUP_KEY,
    POD_KEY,
    RESOURCE_GROUP,
    pod_update_problems,
)
from ..registry import NAME_LABEL, NAME_PATH_SEGMENT, ResourceType
from .daemonset import validate_daemon_set, validate_daemon_set_update
from .devicetaintrule import validate_device_taint_rule_status_update
from .dispatch import CREATE_VALIDATORS, UPDATE_VALIDATORS
from .event import validate_event
from .fielderrors import FORBIDDEN, INVALID, FieldError
from .lease import validate_lease
from .meta import validate_object_meta
from .options import ValidationOptions
from .podgroup import drop_disabled_fields, validate_pod_group
from .resourceclaim import validate_resource_claim_status_update
from .schema import SCHEMAS, prune_unknown_fields

STRICT: Final = "Strict"
WARN: Final = "Warn"
IGNORE: Final = "Ignore"
FIELD_VALIDATION_MODES: Final = (STRICT, WARN, IGNORE)

_NAME_CHECKS: Final = {
    NAME_LABEL: dns_label_problems,
    NAME_PATH_SEGMENT: path_segment_name_problems,
}


ObjectCheck = Callable[[Mapping[str, Any]], list[FieldError]]
UpdateCheck = Callable[[Mapping[str, Any], Mapping[str, Any]], list[FieldError]]


def _none(obj: Mapping[str, Any]) -> list[FieldError]:
    return []


def _pod_update(new: Mapping[str, Any], old: Mapping[str, Any]) -> list[FieldError]:
    problem = pod_update_problems(new, old)
    return [FieldError("spec", FORBIDDEN, problem)] if problem else []


def _crd_update(new: Mapping[str, Any], old: Mapping[str, Any]) -> list[FieldError]:
    found = validate_crd(new)
    group = (new.get("spec") or {}).get("group")
    if group != (old.get("spec") or {}).get("group"):
        found.append(FieldError("spec.group", INVALID, "field is immutable", group))
    return found


# What a built-in (not DRA) kind checks beyond its metadata and schema: of the object on create, and on an update
# of a kind without an update rule of its own; an update rule sees the old object too (immutable fields).
_OBJECT_CHECKS: Final[Mapping[tuple[str, str], ObjectCheck]] = {
    CRD_KEY: validate_crd,
    DAEMONSET_KEY: validate_daemon_set,
    EVENT_KEY: validate_event,
    LEASE_KEY: validate_lease,
    POD_GROUP_KEY: validate_pod_group,
}
_UPDATE_CHECKS: Final[Mapping[tuple[str, str], UpdateCheck]] = {
    POD_KEY: _pod_update,
    DAEMONSET_KEY: validate_daemon_set_update,
    CRD_KEY: _crd_update,
}


class CelSyntaxCheck:
    """Checks DRA CEL selectors at admission as the API server does (k8s.io/kubernetes
    pkg/apis/resource/validation validateCELSelector): compiled in the NewExpressions environment of the
    reported release (what the previous release knows, plus gated options, all DRA gates on here), and
    refused when the estimated cost exceeds CELSelectorExpressionMaxCost. The CEL environment is built on
    first use, so servers that never see a selector never load it."""

    def __init__(self, kube_version: tuple[int, int] = (1, 35)) -> None:
        self._minor = min(max(kube_version[1], 34), 37) if kube_version[0] == 1 else 37
        self._env: Any = None

    def __call__(self, expression: str) -> str | None:
        from dra_driver.cel import DraCelEnvironment

        if self._env is None:
            self._env = DraCelEnvironment(
                kubernetes_minor=self._minor, new_expressions=True, list_type_attributes=True
            )
        problem: str | None = self._env.check_new_expression(expression)
        return problem

    def derived(self, expression: str) -> str | None:
        """A KEP-6080 derived attribute's expression (validateCELExpression with DerivedAttribute set)."""
        self(".")  # builds the environment on first use (its answer for "." does not matter)
        problem: str | None = self._env.check_new_derived(expression)
        return problem


class Admission:
    def __init__(self, options: ValidationOptions) -> None:
        self._options = options

    def _is_dra(self, rt: ResourceType) -> bool:
        return rt.group == RESOURCE_GROUP and rt.kind in SCHEMAS

    def prune(self, rt: ResourceType, obj: dict[str, Any], mode: str,
              decoded_as: str = "") -> tuple[dict[str, Any], list[str]]:
        """Drop fields the typed API (or a custom resource's schema) does not know, as decoding does. Strict mode
        refuses them (400); `decoded_as`, the version a create or update body was decoded at, words the refusal as
        the create and update handlers' transformDecodeError does (`<Kind> in version "<v>" cannot be handled as
        a <Kind>: strict decoding error: ...`, k8s.io/apiserver pkg/endpoints/handlers/rest.go)."""
        if not rt.custom:  # decoding a built-in kind re-encodes its Quantities
            major, minor = self._options.kube_version
            quantities.canonicalize(obj, f"{major}.{minor}", rt.group, rt.versions[0], rt.kind)
        if rt.custom and rt.schema:
            pruned, unknown = crschema.prune(obj, rt.schema)
        elif not self._is_dra(rt):
            return drop_disabled_fields(rt.key, obj, self._options.enabled_gates), []
        else:
            pruned, unknown = prune_unknown_fields(obj, rt.kind, self._options)
            if not unknown:
                return pruned, []  # without the fields of gates that are off
        if not unknown:
            return obj, []
        if mode == STRICT:
            text = "strict decoding error: " + ", ".join(f'unknown field "{p}"' for p in unknown)
            if decoded_as:
                text = f'{rt.kind} in version "{decoded_as}" cannot be handled as a {rt.kind}: {text}'
            raise errors.bad_request(text)
        if mode == IGNORE:
            return pruned, []
        return pruned, [f'unknown field "{p}"' for p in unknown]

    def _meta_errors(self, rt: ResourceType, obj: Mapping[str, Any]) -> list[FieldError]:
        check = _NAME_CHECKS.get(rt.name_format, dns_subdomain_problems)
        return validate_object_meta(obj.get("metadata"), name_check=check, namespaced=rt.namespaced,
                                    builtin=not rt.custom and rt.key != CRD_KEY)  # apiextensions: apimachinery's only

    def _schema_errors(self, rt: ResourceType, obj: Mapping[str, Any]) -> list[FieldError]:
        if not (rt.custom and rt.schema):
            return []
        return crschema.check(obj, rt.schema, skip=("status",) if "status" in rt.subresources else ())

    def validate_create(self, rt: ResourceType, obj: Mapping[str, Any]) -> None:
        if self._is_dra(rt):
            found = CREATE_VALIDATORS[rt.kind](obj, self._options)
        else:
            found = self._meta_errors(rt, obj) + self._schema_errors(rt, obj) + _OBJECT_CHECKS.get(rt.key, _none)(obj)
        self._raise(rt, obj, found)

    def validate_update(self, rt: ResourceType, new: Mapping[str, Any], old: Mapping[str, Any]) -> None:
        if self._is_dra(rt):
            found = UPDATE_VALIDATORS[rt.kind](new, old, self._options)
        else:
            found = self._meta_errors(rt, new) + self._schema_errors(rt, new)
            update_check = _UPDATE_CHECKS.get(rt.key)
            found += update_check(new, old) if update_check else _OBJECT_CHECKS.get(rt.key, _none)(new)
        self._raise(rt, new, found)

    def validate_status_update(self, rt: ResourceType, new: Mapping[str, Any], old: Mapping[str, Any]) -> None:
        found: list[FieldError] = []
        if self._is_dra(rt) and rt.kind == "ResourceClaim":
            found = validate_resource_claim_status_update(new, old, self._options)
        if self._is_dra(rt) and rt.kind == "DeviceTaintRule":
            found = validate_device_taint_rule_status_update(new, old, self._options)
        if rt.custom and rt.schema:
            found = crschema.check(new, rt.schema, only="status")
        self._raise(rt, new, found)

    @staticmethod
    def _raise(rt: ResourceType, obj: Mapping[str, Any], found: list[FieldError]) -> None:
        if found:
            name = str((obj.get("metadata") or {}).get("name") or "")
            raise errors.invalid(rt.kind, rt.group, name, found)
