"""Admin access needs a labelled namespace (KEP-5018): kube-apiserver's ResourceClaim and ResourceClaimTemplate
strategies refuse a request with `adminAccess: true`, and a claim status granting it, unless the namespace carries
`resource.kubernetes.io/admin-access: "true"` (`pkg/registry/resource/utils.go` AuthorizedForAdmin,
AuthorizedForAdminStatus). Both name the first such request or result; the spec path has no `exactly` (upstream's
path is written as it was before the v1 API nested the field) and is the same for a template."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from .fielderrors import FORBIDDEN, FieldError

ADMIN_NAMESPACE_LABEL: Final = "resource.kubernetes.io/admin-access"
MESSAGE: Final = (f"admin access to devices requires the `{ADMIN_NAMESPACE_LABEL}: true` label on the containing "
                  "namespace")


def _list(value: Any) -> Sequence[Any]:
    return value if isinstance(value, list) else []


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def admin_access_spec_errors(spec: Mapping[str, Any], namespace_labels: Mapping[str, str]) -> list[FieldError]:
    """`spec` is a claim's spec (for a template: its spec.spec)."""
    for i, request in enumerate(_list(_map(spec.get("devices")).get("requests"))):
        if _map(_map(request).get("exactly")).get("adminAccess") is True:
            if namespace_labels.get(ADMIN_NAMESPACE_LABEL) != "true":
                return [FieldError(f"spec.devices.requests[{i}].adminAccess", FORBIDDEN, MESSAGE)]
            return []
    return []


def admin_access_status_errors(new_status: Mapping[str, Any], old_status: Mapping[str, Any],
                               namespace_labels: Mapping[str, str]) -> list[FieldError]:
    def first(status: Mapping[str, Any]) -> int | None:
        results = _list(_map(_map(status.get("allocation")).get("devices")).get("results"))
        return next((i for i, r in enumerate(results) if _map(r).get("adminAccess") is True), None)

    if first(old_status) is not None:  # status.allocation is immutable once set
        return []
    index = first(new_status)
    if index is None or namespace_labels.get(ADMIN_NAMESPACE_LABEL) == "true":
        return []
    return [FieldError(f"status.allocation.devices.results[{index}].adminAccess", FORBIDDEN, MESSAGE)]
