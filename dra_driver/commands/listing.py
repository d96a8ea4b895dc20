"""LISTs in pages (k8s/liststream.py's list_all), field selector values and pool names, for the read-only commands
(`explain`, `status`).

A LIST of a large collection (a 1000-node fleet's ResourceSlices: 128 MB of JSON) in one response can outlast a
request timeout and holds the whole answer on the API server at once; pages of PAGE objects with `continue`
tokens (what kubectl and informers do) keep each response bounded.
"""

from __future__ import annotations

from dra_driver.k8s.client import JsonObject
from dra_driver.k8s.liststream import list_all as list_all  # the read-only commands' LIST, where they import it


def field_value(value: str) -> str:
    """A value escaped for a field selector (backslash, `,` and `=` are special, as in Kubernetes' EscapeValue)."""
    return value.replace("\\", "\\\\").replace(",", "\\,").replace("=", "\\=")


def pool_name(raw: JsonObject) -> str:
    """A ResourceSlice's `spec.pool.name` ("" when unreadable): pools are filtered here, since API servers of
    1.34-1.37 cannot select by it (docs/reference/api-requests.md)."""
    spec = raw.get("spec")
    pool = spec.get("pool") if isinstance(spec, dict) else None
    return str(pool.get("name") or "") if isinstance(pool, dict) else ""
