"""Core Events: the namespace rule kube-apiserver applies to every Event it stores (pkg/apis/core/validation/events.go
`legacyValidateEvent`, both groups): an Event about a cluster-scoped object (no involvedObject.namespace) lives in
"default" (or no namespace); with eventTime set (a "new" Event) also in kube-system; otherwise in its object's own
namespace. Found by the differential suite (docs/differential.md)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .fielderrors import INVALID, FieldError


def validate_event(obj: Mapping[str, Any]) -> list[FieldError]:
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), Mapping) else {}
    involved = obj.get("involvedObject") if isinstance(obj.get("involvedObject"), Mapping) else {}
    assert isinstance(meta, Mapping) and isinstance(involved, Mapping)
    namespace = str(meta.get("namespace") or "")
    involved_namespace = str(involved.get("namespace") or "")
    if not obj.get("eventTime"):
        allowed = ("", "default") if not involved_namespace else (involved_namespace,)
    elif not involved_namespace:
        allowed = ("default", "kube-system")
    else:
        return []
    if namespace in allowed:
        return []
    return [FieldError("involvedObject.namespace", INVALID, "does not match event.namespace", involved_namespace)]
