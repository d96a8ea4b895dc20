"""Reading `application/vnd.kubernetes.protobuf` request bodies, for the kinds kubectl's generators send and the
ResourceSlices of a Go DRA driver.

kubectl's typed clients (`kubectl create namespace|configmap|secret|serviceaccount|deployment|job`) always
send protobuf and accept JSON back, whatever discovery says; so does client-go's clientset for built-in kinds,
which a Go kubelet plugin's slice publisher (k8s.io/dynamic-resource-allocation/resourceslice) writes through (the
DRA example driver beside ours in `make bench-peer`). The envelope is the magic `k8s\\0` followed by a
`runtime.Unknown` message (typeMeta{apiVersion=1, kind=2}=1, raw=2, contentEncoding=3, contentType=4); `raw`
is the object's own message. The field numbers below are the wire format of k8s.io/api (generated.proto);
only the messages and fields those generators write are known, any other field is a 415 naming it, never a
silent loss. Answers stay JSON (the clients list `application/json` in Accept).
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

MAGIC: Final = b"k8s\x00"
CONTENT_TYPE: Final = "application/vnd.kubernetes.protobuf"


class ProtobufError(ValueError):
    """The body cannot be read; the message says why (unknown kind or field, broken encoding)."""


@dataclass(frozen=True)
class F:
    """One field: JSON name, type (a scalar name, `msg:<Message>`, `map:<value type>`), repeated or not."""

    name: str
    type: str
    repeated: bool = False
    # A Go pointer: present only when set, so a zero value is kept. Other scalars are always on the wire
    # and, as JSON's omitempty does, dropped when zero.
    ptr: bool = False


_META: Final[Mapping[int, F]] = {
    1: F("name", "string"), 2: F("generateName", "string"), 3: F("namespace", "string"),
    5: F("uid", "string"), 6: F("resourceVersion", "string"), 7: F("generation", "int64"),
    8: F("creationTimestamp", "time"), 11: F("labels", "map:string"), 12: F("annotations", "map:string"),
    13: F("ownerReferences", "msg:OwnerReference", True), 14: F("finalizers", "string", True),
}

MESSAGES: Final[Mapping[str, Mapping[int, F]]] = {
    "ObjectMeta": _META,
    "OwnerReference": {1: F("kind", "string"), 3: F("name", "string"), 4: F("uid", "string"),
                       5: F("apiVersion", "string"), 6: F("controller", "bool", ptr=True),
                       7: F("blockOwnerDeletion", "bool", ptr=True)},
    "LabelSelector": {1: F("matchLabels", "map:string"),
                      2: F("matchExpressions", "msg:LabelSelectorRequirement", True)},
    "LabelSelectorRequirement": {1: F("key", "string"), 2: F("operator", "string"), 3: F("values", "string", True)},
    "Namespace": {1: F("metadata", "msg:ObjectMeta"), 2: F("spec", "msg:NamespaceSpec"), 3: F("status", "msg:Empty")},
    "NamespaceSpec": {1: F("finalizers", "string", True)},
    "ConfigMap": {1: F("metadata", "msg:ObjectMeta"), 2: F("data", "map:string"), 3: F("binaryData", "map:bytes"),
                  4: F("immutable", "bool", ptr=True)},
    "Secret": {1: F("metadata", "msg:ObjectMeta"), 2: F("data", "map:bytes"), 3: F("type", "string"),
               4: F("stringData", "map:string"), 5: F("immutable", "bool", ptr=True)},
    "ServiceAccount": {1: F("metadata", "msg:ObjectMeta"), 4: F("automountServiceAccountToken", "bool", ptr=True)},
    "Deployment": {1: F("metadata", "msg:ObjectMeta"), 2: F("spec", "msg:DeploymentSpec"), 3: F("status", "msg:Empty")},
    "DeploymentSpec": {1: F("replicas", "int32", ptr=True), 2: F("selector", "msg:LabelSelector"),
                       3: F("template", "msg:PodTemplateSpec"), 4: F("strategy", "msg:Empty"),
                       5: F("minReadySeconds", "int32"), 6: F("revisionHistoryLimit", "int32", ptr=True),
                       7: F("paused", "bool"), 9: F("progressDeadlineSeconds", "int32", ptr=True)},
    "Job": {1: F("metadata", "msg:ObjectMeta"), 2: F("spec", "msg:JobSpec"), 3: F("status", "msg:Empty")},
    "JobSpec": {1: F("parallelism", "int32", ptr=True), 2: F("completions", "int32", ptr=True),
                3: F("activeDeadlineSeconds", "int64", ptr=True),
                4: F("selector", "msg:LabelSelector"), 5: F("manualSelector", "bool", ptr=True),
                6: F("template", "msg:PodTemplateSpec"), 7: F("backoffLimit", "int32", ptr=True),
                8: F("ttlSecondsAfterFinished", "int32", ptr=True)},
    "PodTemplateSpec": {1: F("metadata", "msg:ObjectMeta"), 2: F("spec", "msg:PodSpec")},
    "PodSpec": {2: F("containers", "msg:Container", True), 3: F("restartPolicy", "string"),
                4: F("terminationGracePeriodSeconds", "int64", ptr=True),
                5: F("activeDeadlineSeconds", "int64", ptr=True),
                6: F("dnsPolicy", "string"), 7: F("nodeSelector", "map:string"),
                8: F("serviceAccountName", "string"), 10: F("nodeName", "string"),
                19: F("schedulerName", "string"), 20: F("initContainers", "msg:Container", True)},
    "Container": {1: F("name", "string"), 2: F("image", "string"), 3: F("command", "string", True),
                  4: F("args", "string", True), 5: F("workingDir", "string"), 6: F("ports", "msg:ContainerPort", True),
                  7: F("env", "msg:EnvVar", True), 8: F("resources", "msg:ResourceRequirements"),
                  13: F("terminationMessagePath", "string"), 14: F("imagePullPolicy", "string"),
                  20: F("terminationMessagePolicy", "string")},
    "ContainerPort": {1: F("name", "string"), 2: F("hostPort", "int32"), 3: F("containerPort", "int32"),
                      4: F("protocol", "string")},
    "EnvVar": {1: F("name", "string"), 2: F("value", "string")},
    "ResourceRequirements": {1: F("limits", "map:quantity"), 2: F("requests", "map:quantity"),
                             3: F("claims", "msg:ResourceClaimRef", True)},
    "ResourceClaimRef": {1: F("name", "string"), 2: F("request", "string")},
    # resource.k8s.io/v1 (k8s.io/api resource/v1 generated.proto): what a slice of whole devices with attributes and
    # capacities carries. Counters, taints, node selectors and capacity request policies are not known: a 415 naming
    # the field. The pointers (`*string`, `*bool`, an attribute's one value) are kept when zero; a pool's generation
    # and slice count are always on the wire and always in its JSON.
    "ResourceSlice": {1: F("metadata", "msg:ObjectMeta"), 2: F("spec", "msg:ResourceSliceSpec")},
    "ResourceSliceSpec": {1: F("driver", "string"), 2: F("pool", "msg:ResourcePool"),
                          3: F("nodeName", "string", ptr=True), 5: F("allNodes", "bool", ptr=True),
                          6: F("devices", "msg:Device", True), 7: F("perDeviceNodeSelection", "bool", ptr=True)},
    "ResourcePool": {1: F("name", "string"), 2: F("generation", "int64", ptr=True),
                     3: F("resourceSliceCount", "int64", ptr=True)},
    "Device": {1: F("name", "string"), 2: F("attributes", "map:msg:DeviceAttribute"),
               3: F("capacity", "map:msg:DeviceCapacity"), 5: F("nodeName", "string", ptr=True),
               7: F("allNodes", "bool", ptr=True), 9: F("bindsToNode", "bool", ptr=True),
               10: F("bindingConditions", "string", True), 11: F("bindingFailureConditions", "string", True),
               12: F("allowMultipleAllocations", "bool", ptr=True)},
    "DeviceAttribute": {2: F("int", "int64", ptr=True), 3: F("bool", "bool", ptr=True),
                        4: F("string", "string", ptr=True), 5: F("version", "string", ptr=True)},
    "DeviceCapacity": {1: F("value", "quantity")},
    "Empty": {},
}
# (apiVersion, kind) -> top-level message
TOP_LEVEL: Final[Mapping[tuple[str, str], str]] = {
    ("v1", "Namespace"): "Namespace", ("v1", "ConfigMap"): "ConfigMap", ("v1", "Secret"): "Secret",
    ("v1", "ServiceAccount"): "ServiceAccount", ("apps/v1", "Deployment"): "Deployment",
    ("batch/v1", "Job"): "Job", ("resource.k8s.io/v1", "ResourceSlice"): "ResourceSlice",
}


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise ProtobufError("truncated varint")
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ProtobufError("varint too long")


def fields(data: bytes) -> list[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) in order; values are ints (varint, fixed) or bytes (length-delimited)."""
    out: list[tuple[int, int, int | bytes]] = []
    pos = 0
    while pos < len(data):
        tag, pos = _varint(data, pos)
        number, wire = tag >> 3, tag & 7
        value: int | bytes
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire == 2:
            length, pos = _varint(data, pos)
            if pos + length > len(data):
                raise ProtobufError("truncated length-delimited field")
            value, pos = data[pos:pos + length], pos + length
        elif wire == 1:
            value, pos = struct.unpack_from("<q", data, pos)[0], pos + 8
        elif wire == 5:
            value, pos = struct.unpack_from("<i", data, pos)[0], pos + 4
        else:
            raise ProtobufError(f"unsupported wire type {wire}")
        out.append((number, wire, value))
    return out


def _signed(value: int, bits: int) -> int:
    return value - (1 << bits) if value >= 1 << (bits - 1) else value


def _scalar(typ: str, value: int | bytes, where: str) -> Any:
    if typ in ("int32", "int64"):
        if not isinstance(value, int):
            raise ProtobufError(f"{where}: expected a varint")
        return _signed(value, 64)
    if typ == "bool":
        return bool(value)
    if not isinstance(value, bytes):
        raise ProtobufError(f"{where}: expected a length-delimited value")
    if typ == "string":
        return value.decode()
    if typ == "bytes":
        return base64.b64encode(value).decode()
    if typ == "quantity":  # resource.Quantity {string = 1}
        return next((v.decode() for n, _, v in fields(value) if n == 1 and isinstance(v, bytes)), "0")
    if typ == "time":  # meta/v1 Time {int64 seconds = 1; int32 nanos = 2}; the zero time is JSON null
        secs = next((int(v) for n, _, v in fields(value) if n == 1 and isinstance(v, int)), 0)
        if secs == 0:
            return None
        import datetime as _dt

        return _dt.datetime.fromtimestamp(secs, _dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    if typ.startswith("msg:"):
        return decode_message(typ[4:], value, where)
    raise ProtobufError(f"{where}: unknown type {typ}")


def decode_message(message: str, data: bytes, where: str = "") -> dict[str, Any]:
    schema = MESSAGES[message]
    if message == "Empty":  # a part the sandbox resets or ignores (status, strategy)
        return {}
    out: dict[str, Any] = {}
    for number, _, value in fields(data):
        f = schema.get(number)
        path = f"{where}.{f.name}" if f and where else (f.name if f else where)
        if f is None:
            if value in (0, b""):  # a zero scalar or empty message the encoder always writes
                continue
            raise ProtobufError(f"field {number} of {message} at {where or '<root>'} is not known to the sandbox's "
                                "protobuf reader: send JSON")
        if f.type.startswith("map:"):
            if not isinstance(value, bytes):
                raise ProtobufError(f"{path}: expected a map entry")
            entry = {n: v for n, _, v in fields(value)}
            key = entry.get(1, b"")
            if not isinstance(key, bytes):
                raise ProtobufError(f"{path}: map key is not a string")
            out.setdefault(f.name, {})[key.decode()] = _scalar(f.type[4:], entry.get(2, b""), path)
        elif f.repeated:
            out.setdefault(f.name, []).append(_scalar(f.type, value, path))
        else:
            decoded = _scalar(f.type, value, path)
            if f.ptr or f.type.startswith("msg:") or decoded not in ("", 0, False, None):
                out[f.name] = decoded
    return out


def decode(body: bytes) -> dict[str, Any]:
    """The JSON form of a protobuf-encoded object (raises ProtobufError)."""
    if not body.startswith(MAGIC):
        raise ProtobufError("the body does not start with the Kubernetes protobuf magic number")
    unknown = {n: v for n, _, v in fields(body[len(MAGIC):])}
    type_meta = unknown.get(1, b"")
    raw = unknown.get(2, b"")
    if not isinstance(type_meta, bytes) or not isinstance(raw, bytes):
        raise ProtobufError("broken runtime.Unknown envelope")
    tm = {n: v.decode() for n, _, v in fields(type_meta) if isinstance(v, bytes)}
    api_version, kind = tm.get(1, ""), tm.get(2, "")
    message = TOP_LEVEL.get((api_version, kind))
    if message is None:
        raise ProtobufError(f"the sandbox reads protobuf bodies only for {', '.join(k for _, k in TOP_LEVEL)}, "
                            f"not {api_version} {kind}: send JSON")
    obj = decode_message(message, raw)
    obj["apiVersion"], obj["kind"] = api_version, kind
    return obj
