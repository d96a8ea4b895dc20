"""LISTs in pages, field selector values and pool names, for the read-only commands (`explain`, `status`).

A LIST of a large collection (a 1000-node fleet's ResourceSlices: 128 MB of JSON) in one response can outlast a
request timeout and holds the whole answer on the API server at once; pages of PAGE objects with `continue`
tokens (what kubectl and informers do) keep each response bounded.
"""

from __future__ import annotations

from collections.abc import Mapping

from dra_driver.k8s.client import JsonObject, KubeRest
from dra_driver.k8s.liststream import stream_collection

PAGE = 500


def list_all(rest: KubeRest, path: str, query: Mapping[str, str | int | bool] | None = None) -> list[JsonObject]:
    """Every item of a LIST, fetched in pages of PAGE (a continue token that expired restarts it:
    k8s/liststream.py)."""
    items: list[JsonObject] = []
    listed, _ = stream_collection(rest, path, query=query, watch_list=False, on_restart=items.clear, page=PAGE)
    items.extend(listed)
    return items


def field_value(value: str) -> str:
    """A value escaped for a field selector (backslash, `,` and `=` are special, as in Kubernetes' EscapeValue)."""
    return value.replace("\\", "\\\\").replace(",", "\\,").replace("=", "\\=")


def pool_name(raw: JsonObject) -> str:
    """A ResourceSlice's `spec.pool.name` ("" when unreadable): pools are filtered here, since API servers of
    1.34-1.37 cannot select by it (docs/reference/api-requests.md)."""
    spec = raw.get("spec")
    pool = spec.get("pool") if isinstance(spec, dict) else None
    return str(pool.get("name") or "") if isinstance(pool, dict) else ""
