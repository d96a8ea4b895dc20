"""ResourceSlices read as protobuf: kube-apiserver's `application/vnd.kubernetes.protobuf` encoding of a LIST.

Why: at 1,000 nodes one read of every slice is 132 MB of JSON, and encoding it costs kube-apiserver 2.3-2.6 s of CPU;
the same LIST as protobuf (99 MB) costs it 1.1-1.3 s (docs/benchmarks.md, "Fleet on kube-apiserver 1.37"). On a
small control plane that CPU is most of `dra-driver explain`'s wait.

The wire (k8s.io/apimachinery pkg/runtime/serializer/protobuf): the body is the 4-byte magic `k8s\\0`, then a
runtime.Unknown whose `raw` holds the object's own message (here a ResourceSliceList) and whose `contentEncoding`
is empty. Errors come the same way, as a meta/v1 Status. The messages are protos/resourceslice_wire.proto, a subset
of the upstream ones holding only the fields the product reads (their numbers copied from k8s.io/api and
k8s.io/apimachinery v0.37.2); protobuf skips every other field as unknown, so the subset reads any server's answer.

A server that does not serve protobuf answers JSON to `ACCEPT` (it lists JSON second): the sandbox API server does
(docs/sandbox.md), so does an aggregated API server that only speaks JSON. Each page says which it is by its magic.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Final

from google.protobuf.descriptor import Descriptor
from google.protobuf.message import DecodeError, Message

from dra_driver._gen import resourceslice_wire_pb2 as wire

MAGIC: Final = b"k8s\x00"
MEDIA_TYPE: Final = "application/vnd.kubernetes.protobuf"
# JSON second: a server without protobuf for the resource answers JSON rather than 406 (the content negotiation of
# k8s.io/apiserver pkg/endpoints/handlers/negotiation takes the first type it serves).
ACCEPT: Final = f"{MEDIA_TYPE}, application/json"

_TIME: Final = wire.Time.DESCRIPTOR
_QUANTITY: Final = wire.Quantity.DESCRIPTOR
_ATTRIBUTE: Final = wire.DeviceAttribute.DESCRIPTOR


class NotProtobuf(ValueError):
    """The body is not a protobuf-encoded object (no magic, or a compressed or undecodable envelope)."""


def is_protobuf(body: bytes) -> bool:
    return body[:4] == MAGIC


def unwrap(body: bytes) -> bytes:
    """The object's own message bytes out of the `k8s\\0` + runtime.Unknown envelope."""
    if not is_protobuf(body):
        raise NotProtobuf(f"not a protobuf body: {body[:16]!r}")
    try:
        envelope = wire.Unknown.FromString(body[4:])
    except DecodeError as exc:
        raise NotProtobuf(f"undecodable protobuf envelope: {exc}") from exc
    if envelope.contentEncoding:  # the serializer never sets one; a body we cannot read is not to be guessed at
        raise NotProtobuf(f"protobuf envelope with content encoding {envelope.contentEncoding!r}")
    return envelope.raw


def list_page(body: bytes) -> tuple[list[bytes], str]:
    """(each item's message bytes, undecoded; the continue token) of a protobuf LIST body: the envelope and the list
    in one parse (EncodedListEnvelope; a page of 16 MB 27 → 16 ms)."""
    if not is_protobuf(body):
        raise NotProtobuf(f"not a protobuf body: {body[:16]!r}")
    try:
        envelope = wire.EncodedListEnvelope.FromString(body[4:])
    except DecodeError as exc:
        raise NotProtobuf(f"undecodable protobuf list: {exc}") from exc
    if envelope.contentEncoding:  # as `unwrap`
        raise NotProtobuf(f"protobuf envelope with content encoding {envelope.contentEncoding!r}")
    page = envelope.raw
    return list(page.items), getattr(page.metadata, "continue")


def status_of(body: bytes) -> dict[str, Any]:
    """An error answer's meta/v1 Status as its JSON shape (message, reason, code), or {} where it is not readable."""
    try:
        found = wire.Status.FromString(unwrap(body))
    except (NotProtobuf, DecodeError):
        return {}
    return {"kind": "Status", **_message(found)}


def resource_slice(item: bytes) -> dict[str, Any]:
    """One ResourceSlice's message as the JSON object the API would have sent (the fields of the subset: metadata
    without managedFields, the whole spec as of v1 in 1.37). Raises NotProtobuf for bytes that do not decode."""
    try:
        return _message(wire.ResourceSlice.FromString(item))
    except DecodeError as exc:
        raise NotProtobuf(f"undecodable ResourceSlice: {exc}") from exc


def light_slice(item: bytes) -> Any:
    """The light view's message (driver, pool, node, each device's attributes left encoded); see LightSlice."""
    try:
        return wire.LightSlice.FromString(item)
    except DecodeError as exc:
        raise NotProtobuf(f"undecodable ResourceSlice: {exc}") from exc


def status_slice_message(item: bytes) -> Any:
    """The status view's message (metadata, driver, pool, node, each device's name, taints, and its attributes and
    capacities left encoded); see StatusSlice."""
    try:
        return wire.StatusSlice.FromString(item)
    except DecodeError as exc:
        raise NotProtobuf(f"undecodable ResourceSlice: {exc}") from exc


def attribute(encoded: bytes) -> dict[str, Any]:
    """One DeviceAttribute's encoded message as its JSON object ({"string": "NVIDIA H100"})."""
    try:
        return _message(wire.DeviceAttribute.FromString(encoded))
    except DecodeError as exc:
        raise NotProtobuf(f"undecodable DeviceAttribute: {exc}") from exc


def capacity(encoded: bytes) -> dict[str, Any]:
    """One DeviceCapacity's encoded message as its JSON object ({"value": "80Gi"})."""
    try:
        return _message(wire.DeviceCapacity.FromString(encoded))
    except DecodeError as exc:
        raise NotProtobuf(f"undecodable DeviceCapacity: {exc}") from exc


def message_object(message: Message) -> dict[str, Any]:
    """A decoded message of the subset as its JSON object (the conversion `resource_slice` makes)."""
    return _message(message)


def _message(message: Message) -> dict[str, Any]:
    """A message of the subset as its JSON object. The proto field names are the JSON names (go-to-protobuf names
    them so). Only the fields on the wire are written; an empty string is left out, as the JSON encoding leaves out
    an empty `omitempty` string (Go's protobuf writes a value field whatever it holds), except in a DeviceAttribute,
    where a string attribute may be empty."""
    keep_empty = message.DESCRIPTOR is _ATTRIBUTE
    out: dict[str, Any] = {}
    for field, value in message.ListFields():
        if field.message_type is None:
            if field.is_repeated:
                out[field.name] = list(value)
            elif value != "" or keep_empty:
                out[field.name] = value
            continue
        convert = _converter(field.message_type)
        if field.message_type.GetOptions().map_entry:
            entry = field.message_type.fields_by_name["value"]
            if entry.message_type is None:
                out[field.name] = dict(value)
            else:
                of = _converter(entry.message_type)
                out[field.name] = {key: of(item) for key, item in value.items()}
        elif field.is_repeated:
            out[field.name] = [convert(item) for item in value]
        else:
            out[field.name] = convert(value)
    return out


def _converter(descriptor: Descriptor) -> Callable[[Any], Any]:
    if descriptor is _TIME:
        return _time
    if descriptor is _QUANTITY:
        return _quantity
    return _message


def _time(value: Any) -> str:
    """meta/v1 Time as its JSON: RFC 3339 in UTC, to the second."""
    return datetime.fromtimestamp(value.seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _quantity(value: Any) -> str:
    return str(value.string)
