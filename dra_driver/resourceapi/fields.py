"""Reading API JSON strictly: every accessor names the field path it reads, so a bad object produces
"ResourceClaim ns/claim: status.allocation.devices.results[0].pool: is required (a non-empty string)" instead of
a KeyError or a TypeError deep inside whatever used the object. Pure."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dra_driver.errors import DraDriverError
from dra_driver.k8s.quantity import Quantity, QuantityError, parse_quantity

JSON = Mapping[str, Any]


class InvalidObjectError(DraDriverError, ValueError):
    """An API object is malformed. The message names the object, the field path and the fix."""

    def __init__(self, obj: str, path: str, problem: str) -> None:
        super().__init__(f"{obj}: {path}: {problem}")
        self.obj = obj
        self.path = path
        self.problem = problem


def object_name(obj: JSON) -> str:
    """`namespace/name`, `name` for a cluster-scoped object, `<unnamed>` when metadata.name is missing."""
    meta = obj.get("metadata")
    if isinstance(meta, Mapping):
        name = meta.get("name")
        if isinstance(name, str) and name:
            ns = meta.get("namespace")
            return f"{ns}/{name}" if isinstance(ns, str) and ns else name
    return "<unnamed>"


def read_object(kind: str, obj: JSON) -> tuple[FieldReader, JSON]:
    """A reader of one API object's fields, its errors starting `<kind> <namespace>/<name>`, and the object's
    metadata (required)."""
    reader = FieldReader(f"{kind} {object_name(obj)}")
    return reader, reader.mapping(obj.get("metadata"), "metadata", required=True)


@dataclass(frozen=True)
class FieldReader:
    """Typed reads of one object's fields; `obj` ("ResourceClaim ns/name") starts every error message."""

    obj: str

    def fail(self, path: str, problem: str) -> InvalidObjectError:
        return InvalidObjectError(self.obj, path, problem)

    def mapping(self, value: Any, path: str, *, required: bool = False) -> JSON:
        if type(value) is dict:
            return value
        if value is None:
            if required:
                raise self.fail(path, "is required (an object)")
            return {}
        if not isinstance(value, Mapping):
            raise self.fail(path, f"must be an object, got {type(value).__name__}")
        return value

    def seq(self, value: Any, path: str) -> Sequence[Any]:
        if value is None:
            return ()
        if not isinstance(value, list | tuple):
            raise self.fail(path, f"must be a list, got {type(value).__name__}")
        return value

    def entries(self, value: Any, path: str) -> Iterator[tuple[str, JSON]]:
        """(path of the entry, the entry) for each entry of the list at `path`, each one an object."""
        for i, item in enumerate(self.seq(value, path)):
            entry_path = f"{path}[{i}]"
            yield entry_path, self.mapping(item, entry_path, required=True)

    def string(self, value: Any, path: str, *, required: bool = False) -> str:
        if value is None or value == "":
            if required:
                raise self.fail(path, "is required (a non-empty string)")
            return ""
        if not isinstance(value, str):
            raise self.fail(path, f"must be a string, got {type(value).__name__} {value!r}")
        return value

    def strings(self, value: Any, path: str) -> tuple[str, ...]:
        """A list of non-empty strings."""
        return tuple(self.string(item, f"{path}[{i}]", required=True) for i, item in enumerate(self.seq(value, path)))

    def integer(self, value: Any, path: str, *, default: int) -> int:
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(path, f"must be an integer, got {type(value).__name__} {value!r}")
        return value

    def boolean(self, value: Any, path: str) -> bool:
        if value is None:
            return False
        if not isinstance(value, bool):
            raise self.fail(path, f"must be true or false, got {value!r}")
        return value

    def quantity(self, value: Any, path: str) -> Quantity:
        if isinstance(value, bool) or not isinstance(value, str | int):
            raise self.fail(path, f"must be a quantity string such as '40Gi', got {value!r}")
        try:
            return parse_quantity(str(value))
        except QuantityError as err:
            raise self.fail(path, str(err)) from err
