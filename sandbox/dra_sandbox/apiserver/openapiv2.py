"""`/openapi/v2`: the Swagger 2.0 document of the built-in kinds served, as JSON or as gnostic protobuf.

kubectl reads it where OpenAPI v3 has no answer: `kubectl apply`/`create` of a kind whose group/version the
server does not serve (DeviceTaintRule in resource.k8s.io/v1alpha3, a CR without its CRD) first validates
client-side against v2, finds no schema for the kind, and then says what it says against any real server:
`resource mapping not found ... no matches for kind "DeviceTaintRule" in version "resource.k8s.io/v1alpha3"` /
`ensure CRDs are installed first`. Without `/openapi/v2` it stopped at `failed to download openapi` instead.

client-go asks with `Accept: application/com.github.proto-openapi.spec.v2@v1.0+protobuf` and decodes the body
as gnostic's `openapi.v2.Document` (github.com/google/gnostic-models, openapiv2/OpenAPIv2.proto); the field
numbers below are that file's. Anything else gets JSON, as from kube-apiserver. The schemas are the same
Kubernetes definitions `/openapi/v3` serves (`openapi.definitions`), with `$ref`s to `#/definitions/`.
"""

from __future__ import annotations

import functools
import json
import struct
from collections.abc import Mapping
from typing import Any, Final

from . import openapi
from .registry import Registry

PROTOBUF_TYPES: Final = ("application/com.github.proto-openapi.spec.v2@v1.0+protobuf",
                         "application/com.github.proto-openapi.spec.v2.v1.0+protobuf")
# kube-openapi answers both with the second spelling (Go's mime parser refuses the '@' of the first).
PROTOBUF_ANSWER_TYPE: Final = PROTOBUF_TYPES[1]


def _with_ref_v2(out: dict[str, Any], target: str) -> dict[str, Any]:
    # Swagger 2.0 ignores siblings of $ref; Kubernetes' own v2 keeps the description beside it.
    return {"$ref": target, **({"description": out["description"]} if "description" in out else {})}


def _schema(defs: Mapping[str, Any], name: str) -> dict[str, Any]:
    special = openapi.SPECIAL_SCHEMAS.get(name)
    if special is not None:
        return {"description": defs.get(name, {}).get("description", ""), **special}
    converted = openapi.from_json_schema(defs[name], "#/definitions/", _with_ref_v2)
    assert isinstance(converted, dict)
    return converted


def _rows(registry: Registry) -> tuple[tuple[str, str, str], ...]:
    out: list[tuple[str, str, str]] = []
    for rt in registry.all():
        if rt.custom:
            continue
        for v in rt.versions:
            out.append((rt.group, v, rt.kind))
    return tuple(sorted(set(out)))


@functools.lru_cache(maxsize=8)
def _build(kube_version: str, rows: tuple[tuple[str, str, str], ...]) -> str:
    defs = openapi.definitions(kube_version)
    roots = ["io.k8s.apimachinery.pkg.apis.meta.v1.Status", "io.k8s.apimachinery.pkg.apis.meta.v1.DeleteOptions"]
    for group, version, kind in rows:
        for name in (openapi.definition_name(defs, group, version, kind),
                     openapi.definition_name(defs, group, version, kind + "List")):
            if name:
                roots.append(name)
    names = openapi.closure(defs, roots)
    return json.dumps({
        "swagger": "2.0",
        "info": {"title": "Kubernetes", "version": "v" + kube_version.lstrip("v")},
        "paths": {},
        "definitions": {n: _schema(defs, n) for n in names},
    }, sort_keys=True)


def document(registry: Registry, kube_version: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(_build(kube_version, _rows(registry)))
    return doc


@functools.lru_cache(maxsize=8)
def _protobuf(kube_version: str, rows: tuple[tuple[str, str, str], ...]) -> bytes:
    return encode_document(json.loads(_build(kube_version, rows)))


def protobuf_document(registry: Registry, kube_version: str) -> bytes:
    return _protobuf(kube_version, _rows(registry))


def wants_protobuf(accept: str) -> bool:
    offered = [part.split(";")[0].strip() for part in accept.split(",")]
    return any(t in PROTOBUF_TYPES for t in offered)


# ---------------------------------------------------------------------------------------------
# gnostic openapi.v2 wire format
# ---------------------------------------------------------------------------------------------


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _bytes_field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _str(number: int, value: str) -> bytes:
    return _bytes_field(number, value.encode()) if value else b""


def _int(number: int, value: int) -> bytes:
    return _varint(number << 3) + _varint(value & 0xFFFFFFFFFFFFFFFF) if value else b""


def _bool(number: int, value: bool) -> bytes:
    return _varint(number << 3) + b"\x01" if value else b""


def _double(number: int, value: float) -> bytes:
    return _varint(number << 3 | 1) + struct.pack("<d", value)


def _any_yaml(value: Any) -> bytes:
    # gnostic's Any{yaml=2}: kube-openapi parses the YAML text of the extension's value (JSON is YAML).
    return _str(2, json.dumps(value, sort_keys=True))


def _named_any(name: str, value: Any) -> bytes:
    return _str(1, name) + _bytes_field(2, _any_yaml(value))


def _schema_message(node: Mapping[str, Any]) -> bytes:
    out = bytearray()
    out += _str(1, str(node.get("$ref", "")))
    out += _str(2, str(node.get("format", "")))
    out += _str(3, str(node.get("title", "")))
    out += _str(4, str(node.get("description", "")))
    if "default" in node:
        out += _bytes_field(5, _any_yaml(node["default"]))
    for number, key in ((7, "maximum"), (9, "minimum")):
        if isinstance(node.get(key), int | float) and not isinstance(node.get(key), bool):
            out += _double(number, float(node[key]))
    out += _bool(8, bool(node.get("exclusiveMaximum")))
    out += _bool(10, bool(node.get("exclusiveMinimum")))
    for number, key in ((11, "maxLength"), (12, "minLength")):
        if isinstance(node.get(key), int):
            out += _int(number, int(node[key]))
    out += _str(13, str(node.get("pattern", "")))
    for number, key in ((14, "maxItems"), (15, "minItems")):
        if isinstance(node.get(key), int):
            out += _int(number, int(node[key]))
    out += _bool(16, bool(node.get("uniqueItems")))
    for name in node.get("required") or ():
        out += _str(19, str(name))
    extra = node.get("additionalProperties")
    if isinstance(extra, Mapping):
        out += _bytes_field(21, _bytes_field(1, _schema_message(extra)))
    elif isinstance(extra, bool):
        out += _bytes_field(21, _varint(2 << 3) + (b"\x01" if extra else b"\x00"))
    if isinstance(node.get("type"), str):
        out += _bytes_field(22, _str(1, node["type"]))
    items = node.get("items")
    if isinstance(items, Mapping):
        out += _bytes_field(23, _bytes_field(1, _schema_message(items)))
    for sub in node.get("allOf") or ():
        if isinstance(sub, Mapping):
            out += _bytes_field(24, _schema_message(sub))
    props = node.get("properties")
    if isinstance(props, Mapping):
        named = b"".join(_bytes_field(1, _str(1, name) + _bytes_field(2, _schema_message(sub)))
                         for name, sub in props.items() if isinstance(sub, Mapping))
        out += _bytes_field(25, named)
    for key, value in node.items():
        if key.startswith("x-"):
            out += _bytes_field(31, _named_any(key, value))
    return bytes(out)


def encode_document(doc: Mapping[str, Any]) -> bytes:
    """A Swagger 2.0 document (swagger, info, definitions; paths left empty) as gnostic's Document message."""
    info = doc.get("info") or {}
    out = bytearray()
    out += _str(1, str(doc.get("swagger", "2.0")))
    out += _bytes_field(2, _str(1, str(info.get("title", ""))) + _str(2, str(info.get("version", ""))))
    out += _bytes_field(8, b"")
    definitions = b"".join(_bytes_field(1, _str(1, name) + _bytes_field(2, _schema_message(schema)))
                           for name, schema in (doc.get("definitions") or {}).items())
    out += _bytes_field(9, definitions)
    return bytes(out)
