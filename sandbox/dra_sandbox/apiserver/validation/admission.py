"""Admission glue: which checks run for which kind, and how failures become 400/422 answers.

resource.k8s.io kinds get the full rule book of this package and typed-field pruning; CRDs get
their structural checks; every other kind gets metadata checks only (name format, labels,
annotations, ownerReferences), which is all the sandbox promises for them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from dra_driver.k8s.names import dns_label_problems, dns_subdomain_problems, path_segment_name_problems

from .. import crschema, errors, quantities
from ..crds import validate_crd
from ..kinds import CRD_KEY, POD_KEY, RESOURCE_GROUP, pod_update_problems
from ..registry import NAME_LABEL, NAME_PATH_SEGMENT, ResourceType
from .daemonset import validate_daemon_set, validate_daemon_set_update
from .devicetaintrule import validate_device_taint_rule_status_update
from .dispatch import CREATE_VALIDATORS, UPDATE_VALIDATORS
from .event import validate_event
from .fielderrors import FORBIDDEN, INVALID, FieldError
from .lease import validate_lease
from .meta import validate_object_meta
from .options import ValidationOptions
from .resourceclaim import validate_resource_claim_status_update
from .schema import SCHEMAS, prune_unknown_fields

STRICT: Final = "Strict"
WARN: Final = "Warn"
IGNORE: Final = "Ignore"
FIELD_VALIDATION_MODES: Final = (STRICT, WARN, IGNORE)

DAEMONSET_KEY: Final = ("apps", "daemonsets")
EVENT_KEY: Final = ("", "events")
LEASE_KEY: Final = ("coordination.k8s.io", "leases")
_NAME_CHECKS: Final = {
    NAME_LABEL: dns_label_problems,
    NAME_PATH_SEGMENT: path_segment_name_problems,
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
            return obj, []
        else:
            pruned, unknown = prune_unknown_fields(obj, rt.kind, self._options)
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
            found = self._meta_errors(rt, obj) + self._schema_errors(rt, obj)
            if rt.key == CRD_KEY:
                found += validate_crd(obj)
            if rt.key == DAEMONSET_KEY:
                found += validate_daemon_set(obj)
            if rt.key == EVENT_KEY:
                found += validate_event(obj)
            if rt.key == LEASE_KEY:
                found += validate_lease(obj)
        self._raise(rt, obj, found)

    def validate_update(self, rt: ResourceType, new: Mapping[str, Any], old: Mapping[str, Any]) -> None:
        if self._is_dra(rt):
            found = UPDATE_VALIDATORS[rt.kind](new, old, self._options)
        else:
            found = self._meta_errors(rt, new) + self._schema_errors(rt, new)
            if rt.key == POD_KEY:
                problem = pod_update_problems(new, old)
                if problem:
                    found.append(FieldError("spec", FORBIDDEN, problem))
            if rt.key == DAEMONSET_KEY:
                found += validate_daemon_set_update(new, old)
            if rt.key == EVENT_KEY:
                found += validate_event(new)
            if rt.key == LEASE_KEY:
                found += validate_lease(new)
            if rt.key == CRD_KEY:
                found += validate_crd(new)
                if (new.get("spec") or {}).get("group") != (old.get("spec") or {}).get("group"):
                    found.append(FieldError("spec.group", INVALID, "field is immutable",
                                            (new.get("spec") or {}).get("group")))
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
