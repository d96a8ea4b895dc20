"""What the sandbox's controllers (the scheduler stand-in, the node lifecycle and device taint eviction controllers,
the differential runs) send the API server beyond KubeRest's plain requests."""

from __future__ import annotations

from typing import Any

from dra_driver.k8s.client import JsonObject, KubeRest

MERGE_PATCH = "application/merge-patch+json"


def merge_patch(rest: KubeRest, path: str, body: Any) -> JsonObject:
    """A JSON merge patch (RFC 7386) of the object at `path`: the fields in `body` replace the stored ones (lists
    whole), `null` removes one. Returns the object as stored after the patch."""
    result: JsonObject = rest.request("PATCH", path, body=body, content_type=MERGE_PATCH)
    return result
