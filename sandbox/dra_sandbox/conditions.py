"""Reading an API object's status conditions (`status.conditions`, metav1.Condition or a kind's own type)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def status_condition(obj: Mapping[str, Any] | None, kind: str) -> Mapping[str, Any] | None:
    """The first condition of type `kind` in `obj`'s status, or None (no object, no status, no such condition)."""
    conditions = ((obj or {}).get("status") or {}).get("conditions") or ()
    return next((c for c in conditions if isinstance(c, Mapping) and c.get("type") == kind), None)
