"""Our own protobuf encoder of the ResourceSlice subset (protos/resourceslice_wire.proto), for tests: a JSON object
as kube-apiserver would send it in protobuf, in the `k8s\\0` + runtime.Unknown envelope. The inverse of
dra_driver/k8s/sliceproto.py's conversion (field names are the JSON names; Time and Quantity as upstream)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from google.protobuf.message import Message

from dra_driver._gen import resourceslice_wire_pb2 as wire
from dra_driver.k8s.sliceproto import MAGIC


def fill(message: Message, obj: Mapping[str, Any], *, strict: bool = True) -> Message:
    """Sets `message`'s fields from the JSON object. A key the subset does not hold is an error when `strict`, else
    left out (as the subset's reader skips what it does not hold)."""
    fields = message.DESCRIPTOR.fields_by_name
    for key, value in obj.items():
        if key not in fields and (not strict or key in ("apiVersion", "kind")):
            continue
        field = fields[key]
        if value is None:
            continue
        target = getattr(message, key)
        if field.message_type is None:
            if field.is_repeated:
                target.extend(value)
            else:
                setattr(message, key, value)
        elif field.message_type.GetOptions().map_entry:
            entry = field.message_type.fields_by_name["value"]
            for k, v in value.items():
                if entry.message_type is None:
                    target[k] = v
                else:
                    _set(target[k], v, strict)
        elif field.is_repeated:
            for item in value:
                _set(target.add(), item, strict)
        else:
            _set(target, value, strict)
    return message


def _set(message: Message, value: Any, strict: bool) -> None:
    if message.DESCRIPTOR is wire.Time.DESCRIPTOR:
        seconds = int(datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp())
        message.seconds = seconds  # type: ignore[attr-defined]
    elif message.DESCRIPTOR is wire.Quantity.DESCRIPTOR:
        message.string = str(value)  # type: ignore[attr-defined]
    else:
        message.MergeFrom(fill(type(message)(), value, strict=strict))  # a fresh one: MergeFrom marks it present even when empty


def envelope(raw: bytes, kind: str, api_version: str = "resource.k8s.io/v1") -> bytes:
    """`k8s\\0` + runtime.Unknown{typeMeta, raw}, as the API server's protobuf serializer writes a body."""
    unknown = wire.Unknown(typeMeta=wire.TypeMeta(apiVersion=api_version, kind=kind), raw=raw)
    return MAGIC + unknown.SerializeToString()


def slice_bytes(obj: Mapping[str, Any], *, strict: bool = True) -> bytes:
    """One ResourceSlice's message bytes."""
    return fill(wire.ResourceSlice(), obj, strict=strict).SerializeToString()


def slice_list(items: Sequence[Mapping[str, Any]], continue_token: str = "", resource_version: str = "1", *,
               strict: bool = True) -> bytes:
    """A whole ResourceSliceList body, enveloped."""
    meta = wire.ListMeta(resourceVersion=resource_version)
    if continue_token:
        setattr(meta, "continue", continue_token)
    listed = wire.EncodedList(metadata=meta, items=[slice_bytes(item, strict=strict) for item in items])
    return envelope(listed.SerializeToString(), "ResourceSliceList")
