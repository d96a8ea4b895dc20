"""ResourceSlices sent as protobuf, as client-go's clientset sends them (a Go kubelet plugin's slice publisher, the
DRA example driver of `make bench-peer`): stored as the same slice in JSON would be; a field the reader does not know
is a 415 naming it. The bodies are built here field by field from k8s.io/api resource/v1's field numbers."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from dra_sandbox.apiserver import ApiServer
from dra_sandbox.apiserver.protobuf import CONTENT_TYPE, MAGIC


def _varint(value: int) -> bytes:
    out = bytearray()
    value &= (1 << 64) - 1
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _int(number: int, value: int) -> bytes:
    return _varint(number << 3) + _varint(value)


def _bytes(number: int, value: bytes | str) -> bytes:
    data = value.encode() if isinstance(value, str) else value
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def _entry(number: int, key: str, value: bytes) -> bytes:
    return _bytes(number, _bytes(1, key) + _bytes(2, value))


def _slice(node_uid: str, extra_device_field: bytes = b"") -> bytes:
    owner = _bytes(1, "Node") + _bytes(3, "n1") + _bytes(4, node_uid) + _bytes(5, "v1") + _int(6, 1)
    meta = _bytes(2, "00000-gpu.example.com-n1-") + _bytes(13, owner)
    device = (_bytes(1, "gpu-0") + _entry(2, "index", _int(2, 0)) + _entry(2, "model", _bytes(4, "LATEST"))
              + _entry(2, "driverVersion", _bytes(5, "1.0.0")) + _entry(2, "healthy", _int(3, 1))
              + _entry(3, "memory", _bytes(1, _bytes(1, "80Gi"))) + _int(12, 0) + extra_device_field)
    pool = _bytes(1, "n1") + _int(2, 0) + _int(3, 1)
    spec = _bytes(1, "gpu.example.com") + _bytes(2, pool) + _bytes(3, "n1") + _bytes(6, device)
    raw = _bytes(1, meta) + _bytes(2, spec)
    return MAGIC + _bytes(1, _bytes(1, "resource.k8s.io/v1") + _bytes(2, "ResourceSlice")) + _bytes(2, raw)


def _post(server: ApiServer, body: bytes, path: str = "/apis/resource.k8s.io/v1/resourceslices",
          content_type: str = CONTENT_TYPE) -> tuple[int, Any]:
    req = urllib.request.Request(server.url + path, data=body, method="POST",
                                 headers={"Content-Type": content_type, "Accept": f"{CONTENT_TYPE}, application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"null")


def _node(server: ApiServer) -> str:
    """Node n1 (the slices' owner: the sandbox's garbage collector removes a slice whose owner does not exist)."""
    existing = [n for n in server.snapshot("", "nodes") if n["metadata"]["name"] == "n1"]
    if existing:
        return str(existing[0]["metadata"]["uid"])
    body = json.dumps({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}).encode()
    status, node = _post(server, body, "/api/v1/nodes", "application/json")
    assert status == 201, node
    return str(node["metadata"]["uid"])


def test_a_protobuf_slice_is_stored_as_its_json_form_would_be(server: ApiServer) -> None:
    uid = _node(server)
    status, created = _post(server, _slice(uid))
    assert status == 201, created
    assert created["metadata"]["name"].startswith("00000-gpu.example.com-n1-")
    assert created["metadata"]["ownerReferences"] == [
        {"kind": "Node", "name": "n1", "uid": uid, "apiVersion": "v1", "controller": True}]
    stored = next(s for s in server.snapshot("resource.k8s.io", "resourceslices")
                  if s["metadata"]["name"] == created["metadata"]["name"])
    assert stored["spec"]["driver"] == "gpu.example.com" and stored["spec"]["nodeName"] == "n1"
    assert stored["spec"]["pool"] == {"name": "n1", "generation": 0, "resourceSliceCount": 1}  # zero kept
    assert stored["spec"]["devices"] == [{
        "name": "gpu-0",
        "attributes": {"index": {"int": 0}, "model": {"string": "LATEST"}, "driverVersion": {"version": "1.0.0"},
                       "healthy": {"bool": True}},
        "capacity": {"memory": {"value": "80Gi"}},
        "allowMultipleAllocations": False,  # a *bool set to false stays false, not absent
    }]


def test_a_slice_field_the_reader_does_not_know_is_refused_naming_it(server: ApiServer) -> None:
    taint = _bytes(8, _bytes(1, "example.com/broken") + _bytes(3, "NoSchedule"))  # Device.taints: not known
    status, body = _post(server, _slice(_node(server), taint))
    assert status == 415
    assert "field 8 of Device at spec.devices is not known to the sandbox's protobuf reader: send JSON" in body[
        "message"]
    assert not [s for s in server.snapshot("resource.k8s.io", "resourceslices")
                if s["spec"]["devices"][0].get("taints")]
