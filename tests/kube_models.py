"""Typed access to the kubernetes client's models in tests.

The generated models declare every field optional (`metadata: V1ObjectMeta | None`, `name: str | None`), while a
test knows what the API server filled in. These helpers assert that a field is set and hand it on with its real
type, so a missing field fails the test where it is read instead of later as an AttributeError on None.

Request bodies written as JSON are turned into models with `Model.model_validate(body)` at the call: the client's
methods validate a dict argument into that model themselves (pydantic), so this is what happens at run time anyway.
"""

from __future__ import annotations

from typing import Any, Protocol, TypeVar

import kubernetes.client as k

from tests.narrow import present

M = TypeVar("M", covariant=True)


class HasMetadata(Protocol[M]):
    """An object (metadata: V1ObjectMeta) or a list (metadata: V1ListMeta) of the kubernetes client."""

    @property
    def metadata(self) -> M | None: ...


def meta(obj: HasMetadata[M]) -> M:
    """The metadata of an object or list, which everything the API server returns has."""
    return present(obj.metadata)


def name_of(obj: HasMetadata[k.V1ObjectMeta]) -> str:
    return present(meta(obj).name)


def resource_version(obj: HasMetadata[k.V1ObjectMeta | k.V1ListMeta]) -> int:
    """metadata.resourceVersion of an object or list as the number the sandbox API server makes it."""
    return int(present(meta(obj).resource_version))


def as_json(value: object) -> dict[str, Any]:
    """A custom object as the client returns it: decoded JSON, which its methods annotate as `object`."""
    assert isinstance(value, dict), f"expected a JSON object, got {type(value).__name__}"
    return value
