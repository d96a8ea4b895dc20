"""Strict validation against Kubernetes' published JSON schemas, each schema file parsed once per test process.

`kubernetes_validate.validate` re-reads and re-parses the version's `_definitions.json` (megabytes) for every object
it checks: 454 chart objects took 23 s, 18 s of it in `json.load`. This calls the same function with its file reader
memoised for the duration of the call, so the verdicts, the version chosen and the exceptions raised
(`kubernetes_validate.ValidationError`, `SchemaNotFoundError`) are the library's own.
"""

from __future__ import annotations

import functools
from typing import Any
from unittest import mock

import kubernetes_validate
from kubernetes_validate import utils

_read_schema = utils.schema_contents


@functools.cache
def _schema(filename: str, desired_version: str) -> Any:
    return _read_schema(filename, desired_version)


def validate(obj: dict[str, Any], kube_version: str) -> str:
    """Validate `obj` strictly (unknown fields refused) for `kube_version`; return the major.minor checked against."""
    with mock.patch.object(utils, "schema_contents", _schema):
        used: str = kubernetes_validate.validate(obj, kube_version, strict=True)
    return used
