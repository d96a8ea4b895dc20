"""The daemon's side of its ComputeDomainClique (`<cdUID>.<cliqueID>` in the driver's namespace): read it, write
its own entry, watch it. Each daemon writes only its own entry, but `daemons[]` is one list (a list-map keyed by
nodeName), so every write is GET + PUT with the resourceVersion read; a 409 (another daemon wrote first) reads
again and re-applies the change on the newer list. A clique that does not exist yet is created by the first
daemon (a second one's create answers 409 AlreadyExists, and it updates instead).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import structlog

from dra_driver.computedomain.model import ComputeDomainClique, DomainNode, parse_clique
from dra_driver.computedomain.names import CLIQUE_KIND, GROUP_VERSION
from dra_driver.k8s.client import ApiError, JsonObject, KubeRest, WatchStream

log = structlog.get_logger(__name__)

# Conflicts in a row before giving up on one change (each is another daemon's successful write in between).
MAX_CONFLICTS = 100

# daemons[] as read -> daemons[] to write, or None: nothing to write.
Change = Callable[[tuple[DomainNode, ...]], "tuple[DomainNode, ...] | None"]


class CliqueConflict(ApiError):
    """MAX_CONFLICTS writes in a row were refused as conflicting."""


@dataclass(frozen=True)
class CliqueRef:
    namespace: str
    name: str


class CliqueClient:
    """Request paths are spelled out (/apis/<GROUP_VERSION>/.../<CLIQUE_PLURAL>) at each call: the chart's RBAC
    test reads them from the source."""

    def __init__(self, rest: KubeRest, ref: CliqueRef) -> None:
        self.rest = rest
        self.ref = ref

    def read(self) -> ComputeDomainClique | None:
        ns, name = self.ref.namespace, self.ref.name
        obj = self.rest.get(f"/apis/gpu.dra.dev/v1beta1/namespaces/{ns}/computedomaincliques/{name}")
        return parse_clique(obj) if obj is not None else None

    def change(self, change: Change) -> ComputeDomainClique | None:
        """Apply `change` to the current daemons[] and write the result, until a write is not refused as a
        conflict. Returns the clique as written (or as read when `change` wrote nothing; None: none exists)."""
        ns, name = self.ref.namespace, self.ref.name
        for _ in range(MAX_CONFLICTS):
            obj = self.rest.get(f"/apis/gpu.dra.dev/v1beta1/namespaces/{ns}/computedomaincliques/{name}")
            current = parse_clique(obj) if obj is not None else None
            wanted = change(current.daemons if current is not None else ())
            if wanted is None:
                return current
            try:
                if obj is None:
                    written = self.rest.request(
                        "POST", f"/apis/gpu.dra.dev/v1beta1/namespaces/{ns}/computedomaincliques",
                        body=self._new_object(wanted))
                else:
                    written = self.rest.request(
                        "PUT", f"/apis/gpu.dra.dev/v1beta1/namespaces/{ns}/computedomaincliques/{name}",
                        body={**obj, "daemons": _entries(wanted)})
            except ApiError as exc:
                if exc.status == 409:  # another daemon wrote (or created the clique) first: choose again
                    log.debug("clique write conflict; reading again", clique=self.ref.name)
                    continue
                raise
            return parse_clique(written)
        raise CliqueConflict(409, f"clique {self.ref.name}: {MAX_CONFLICTS} conflicting writes in a row")

    def watch(self, resource_version: str, timeout_seconds: int) -> WatchStream:
        """Events of this clique only (metadata.name field selector), after `resource_version`."""
        query: dict[str, str | int | bool] = {"fieldSelector": f"metadata.name={self.ref.name}",
                                              "allowWatchBookmarks": True}
        if resource_version:
            query["resourceVersion"] = resource_version
        ns = self.ref.namespace
        return self.rest.watch(f"/apis/gpu.dra.dev/v1beta1/namespaces/{ns}/computedomaincliques", query=query,
                               timeout_seconds=timeout_seconds)

    def _new_object(self, daemons: tuple[DomainNode, ...]) -> JsonObject:
        return {"apiVersion": GROUP_VERSION, "kind": CLIQUE_KIND,
                "metadata": {"name": self.ref.name, "namespace": self.ref.namespace},
                "daemons": _entries(daemons)}


def _entries(daemons: tuple[DomainNode, ...]) -> list[dict[str, Any]]:
    return [d.to_json(key="nodeName") for d in daemons]


def clique_events(stream: WatchStream) -> Iterator[tuple[str, JsonObject]]:
    """(type, object) of each event; BOOKMARK objects carry only the resourceVersion."""
    for event in stream:
        kind = str(event.get("type") or "")
        obj = event.get("object")
        if isinstance(obj, dict):
            yield kind, obj
