"""ResourceSlices read as protobuf (`dra_driver.k8s.sliceproto`, `commands/protoviews.py`, `statusproto.py`, `liststream.stream_pages`)
from bytes built by our own encoder of the subset (tests/kube/protoencode.py): the envelope, the conversion back to
the JSON object, the pool sieve's view and verdicts against the JSON path's, the paged reader's protobuf and JSON
answers. The same from bytes kube-apiserver encoded: tests/upstream/test_protobuf_slices.py."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import msgspec
import pytest

from bench import fleet_bench
from bench.fleet_upstream_bench import claim, fleet
from dra_driver.allocation.prune import PoolSieve, claim_reach
from dra_driver.cel import DraCelEnvironment
from dra_driver.commands.protoviews import ProtoSieveFeed
from dra_driver.defaults import DRIVER_NAME
from dra_driver.k8s import sliceproto
from dra_driver.k8s.client import ApiError, KubeRest
from dra_driver.k8s.liststream import stream_pages
from dra_sandbox.deviceclasses import device_classes
from tests.kube.localrest import QuietHandler, rest_serving
from tests.kube.protoencode import envelope, slice_bytes, slice_list

SLICES = "/apis/resource.k8s.io/v1/resourceslices"


def _edge_slice() -> dict[str, Any]:
    """Every kind of field the subset holds, with the values a careless conversion gets wrong (an empty string
    attribute, an int 0, a bool false, a version, lists, a policy, counters, taints with a time)."""
    return {
        "metadata": {"name": "edge", "uid": "u-1", "resourceVersion": "42", "generation": 3,
                     "creationTimestamp": "2026-12-02T10:00:00Z", "labels": {"a": "b"},
                     "annotations": {"gpu.dra.dev/device-plugin": "[]"},
                     "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "n", "uid": "u-n",
                                          "controller": True}]},
        "spec": {
            "driver": "gpu.dra.dev", "pool": {"name": "p", "generation": 0, "resourceSliceCount": 2},
            "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "k", "operator": "In", "values": ["x", "y"]}]}]},
            "sharedCounters": [{"name": "gpu-0", "counters": {"memory": {"value": "80Gi"}}}],
            "devices": [{
                "name": "gpu-0",
                "attributes": {"empty": {"string": ""}, "zero": {"int": 0}, "off": {"bool": False},
                               "driverVersion": {"version": "1.2.3"}, "ints": {"ints": [1, 2]},
                               "gpu.dra.dev/productName": {"string": "NVIDIA H100"}},
                "capacity": {"memory": {"value": "80Gi"},
                             "share": {"value": "1", "requestPolicy": {"default": "1", "validRange": {"min": "1"}}}},
                "consumesCounters": [{"counterSet": "gpu-0", "counters": {"memory": {"value": "80Gi"}},
                                      "compatibilityGroups": ["g"]}],
                "taints": [{"key": "k", "value": "v", "effect": "NoSchedule",
                            "timeAdded": "2026-12-02T11:00:00Z"}],
                "bindsToNode": True, "bindingConditions": ["ready"], "allowMultipleAllocations": True,
            }],
        },
    }


def _fleet_slices(size: int) -> list[dict[str, Any]]:
    inventories = fleet_bench._inventories()
    out = []
    for node in fleet(size):
        for i, built in enumerate(fleet_bench._node_slices(inventories, node.name, node.preset, node.salt)):
            built.setdefault("metadata", {}).update(name=f"{node.name}-{i}", uid=f"uid-{node.name}-{i}",
                                                    resourceVersion="7")
            built.pop("apiVersion", None)
            built.pop("kind", None)
            out.append(built)
    return out


@pytest.fixture(scope="module")
def fleet_slices() -> list[dict[str, Any]]:
    return _fleet_slices(12)


def test_a_slice_converts_back_to_its_json_object() -> None:
    edge = _edge_slice()
    assert sliceproto.resource_slice(slice_bytes(edge)) == edge


def test_fleet_slices_convert_back_to_their_json_objects(fleet_slices: list[dict[str, Any]]) -> None:
    for obj in fleet_slices:
        assert sliceproto.resource_slice(slice_bytes(obj)) == obj


def test_a_list_body_is_unwrapped_into_its_items_and_continue_token(fleet_slices: list[dict[str, Any]]) -> None:
    items, token = sliceproto.list_page(slice_list(fleet_slices[:3], continue_token="next"))
    assert token == "next"
    assert [sliceproto.resource_slice(i) for i in items] == fleet_slices[:3]


FIXTURES = Path(__file__).parent / "fixtures"


def test_kube_apiservers_own_bytes_convert_to_what_its_json_says() -> None:
    """A LIST kube-apiserver 1.37.2 answered in protobuf and in JSON (recorded by tests/upstream/
    test_protobuf_slices.py): the same objects, less managedFields (not in the subset) and the zero values Go's
    protobuf writes where JSON leaves them out."""
    items, token = sliceproto.list_page((FIXTURES / "resourceslices-1.37.pb").read_bytes())
    expected = json.loads((FIXTURES / "resourceslices-1.37.json").read_bytes())["items"]
    assert token == "" and len(items) == len(expected) == 1
    for item, obj in zip(items, expected, strict=True):
        meta = {k: v for k, v in obj["metadata"].items() if k != "managedFields"}
        got = sliceproto.resource_slice(item)
        assert {**got, "metadata": {k: v for k, v in got["metadata"].items() if v != 0}} == {**obj, "metadata": meta}
        assert got["spec"]["devices"][0]["attributes"]["empty"] == {"string": ""}
        assert got["spec"]["devices"][0]["attributes"]["zero"] == {"int": 0}


@pytest.mark.parametrize("body", [b'{"kind": "ResourceSliceList"}', b"k8s\x00\xff\xff", b""])
def test_a_body_that_is_not_protobuf_is_refused(body: bytes) -> None:
    with pytest.raises(sliceproto.NotProtobuf):
        sliceproto.list_page(body)


def test_a_list_with_a_content_encoding_is_refused(fleet_slices: list[dict[str, Any]]) -> None:
    """The serializer never sets one; a body in a coding this reader does not know is not guessed at."""
    from dra_driver._gen import resourceslice_wire_pb2 as wire

    raw = slice_list(fleet_slices[:2])[len(sliceproto.MAGIC):]
    coded = wire.Unknown.FromString(raw)
    coded.contentEncoding = "gzip"
    with pytest.raises(sliceproto.NotProtobuf, match="content encoding 'gzip'"):
        sliceproto.list_page(sliceproto.MAGIC + coded.SerializeToString())
    assert len(sliceproto.list_page(slice_list(fleet_slices[:2]))[0]) == 2


def test_an_error_status_is_read_from_protobuf() -> None:
    from dra_driver._gen import resourceslice_wire_pb2 as wire

    body = envelope(wire.Status(status="Failure", message="too old", reason="Expired", code=410)
                    .SerializeToString(), "Status", "v1")
    assert sliceproto.status_of(body) == {"kind": "Status", "status": "Failure", "message": "too old",
                                          "reason": "Expired", "code": 410}


@pytest.mark.parametrize("name", ["nowhere", "nine", "last"])
def test_the_sieve_judges_protobuf_slices_as_it_judges_their_json(fleet_slices: list[dict[str, Any]],
                                                                  name: str) -> None:
    classes = device_classes(DRIVER_NAME)
    answers = []
    for protobuf in (False, True):
        reach = claim_reach(claim(name), classes, cel=DraCelEnvironment())
        assert reach is not None
        sieve = PoolSieve(reach)
        feed = ProtoSieveFeed(sieve, reach)
        for obj in fleet_slices:
            if protobuf:
                feed.add(slice_bytes(obj))
            else:
                sieve.add_encoded(msgspec.json.encode(obj))
        answers.append(sieve.result())
    assert answers[0] == answers[1]
    kept, pruned = answers[1]
    assert (len(kept) > 0) == (name == "last") and pruned.slices + pruned.short_slices > 0


@pytest.mark.parametrize("name", ["nowhere", "nine", "last"])
def test_each_slice_counts_as_its_json_light_view(fleet_slices: list[dict[str, Any]], name: str) -> None:
    """Per slice, the devices each request alternative may accept: the feed's grouped count of the protobuf
    message is the allocator's count of the JSON light view (edge values included)."""
    from dra_driver.allocation.prune import _LIGHT

    reach = claim_reach(claim(name), device_classes(DRIVER_NAME), cel=DraCelEnvironment())
    assert reach is not None
    feed = ProtoSieveFeed(PoolSieve(reach), reach)
    for obj in [*fleet_slices, _edge_slice()]:
        spec = _LIGHT.decode(msgspec.json.encode(obj)).spec
        assert spec is not None
        message = sliceproto.light_slice(slice_bytes(obj)).spec
        assert feed.accepted(message.driver, message.devices) == reach.accepted_light(spec)
    no_driver = sliceproto.light_slice(slice_bytes({"spec": {"devices": [{"name": "d"}]}})).spec
    json_spec = _LIGHT.decode(b'{"spec": {"devices": [{"name": "d"}]}}').spec
    assert json_spec is not None
    assert feed.accepted(None, no_driver.devices) == reach.accepted_light(json_spec)


def test_the_status_view_is_the_json_status_view(fleet_slices: list[dict[str, Any]]) -> None:
    from dra_driver.commands.status import status_slice
    from dra_driver.commands.statusproto import StatusSlices

    views = StatusSlices()
    for obj in [*fleet_slices, _edge_slice()]:
        assert views.slice(slice_bytes(obj)) == status_slice(msgspec.json.encode(obj))


# --- the paged reader against a scripted server ------------------------------------------------------------------


@contextlib.contextmanager
def _server(pages: list[bytes], *, json_only: bool = False, expire_once: bool = False,
            requested: threading.Event | None = None) -> Iterator[tuple[KubeRest, list[tuple[str, str]]]]:
    """Serves `pages` (each a list body) by continue token "1", "2", ...; in protobuf when the Accept asks for it,
    unless json_only; `expire_once`: the first request with a continue token is answered 410; `requested`: set
    at each request."""
    seen: list[tuple[str, str]] = []
    expired = [not expire_once]

    class Handler(QuietHandler):
        def do_GET(self) -> None:
            query = {k: v[0] for k, v in parse_qs(urlsplit(self.path).query).items()}
            accept = self.headers.get("Accept", "")
            seen.append((query.get("continue", ""), accept))
            if requested is not None:
                requested.set()
            index = int(query.get("continue") or 0)
            if index and not expired[0]:
                expired[0] = True
                self._answer(410, b'{"kind": "Status", "code": 410, "reason": "Expired"}', "application/json")
                return
            wants = accept.startswith(sliceproto.MEDIA_TYPE) and not json_only
            body = pages[index]
            self._answer(200, body if wants else _as_json(body, index + 1 < len(pages), index),
                         sliceproto.MEDIA_TYPE if wants else "application/json")

        def _answer(self, status: int, body: bytes, media: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", media)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    with rest_serving(Handler) as rest:
        yield rest, seen


def _as_json(body: bytes, more: bool, index: int) -> bytes:
    items, _ = sliceproto.list_page(body)
    return msgspec.json.encode({"kind": "ResourceSliceList", "metadata": {"continue": str(index + 1) if more else ""},
                                "items": [sliceproto.resource_slice(i) for i in items]})


def _paged(objects: list[dict[str, Any]], size: int) -> list[bytes]:
    chunks = [objects[i:i + size] for i in range(0, len(objects), size)]
    return [slice_list(chunk, continue_token=str(n + 1) if n + 1 < len(chunks) else "")
            for n, chunk in enumerate(chunks)]


def _decoded(item: Any) -> dict[str, Any]:
    return sliceproto.resource_slice(item.data) if item.protobuf else msgspec.json.decode(item.data)


def test_pages_are_read_in_protobuf_where_the_server_sends_it(fleet_slices: list[dict[str, Any]]) -> None:
    with _server(_paged(fleet_slices, 10)) as (rest, seen):
        items = list(stream_pages(rest, SLICES, page=10))
    assert all(item.protobuf for item in items)
    assert [_decoded(i) for i in items] == fleet_slices
    assert [c for c, _ in seen] == ["", "1", "2", "3"][:len(seen)] and len(seen) == -(-len(fleet_slices) // 10)
    assert all(accept == sliceproto.ACCEPT for _, accept in seen)


def test_a_server_without_protobuf_answers_json_and_is_read_as_json(fleet_slices: list[dict[str, Any]]) -> None:
    with _server(_paged(fleet_slices, 10), json_only=True) as (rest, _):
        items = list(stream_pages(rest, SLICES, page=10))
    assert not any(item.protobuf for item in items)
    assert [_decoded(i) for i in items] == fleet_slices


def test_json_only_is_asked_for_when_protobuf_is_not_wanted(fleet_slices: list[dict[str, Any]]) -> None:
    with _server(_paged(fleet_slices[:5], 10)) as (rest, seen):
        items = list(stream_pages(rest, SLICES, page=10, protobuf=False))
    assert not any(item.protobuf for item in items) and seen[0][1] == "application/json"


def test_an_expired_continue_token_restarts_the_protobuf_list(fleet_slices: list[dict[str, Any]]) -> None:
    restarts: list[int] = []
    with _server(_paged(fleet_slices[:25], 10), expire_once=True) as (rest, seen):
        got: list[dict[str, Any]] = []

        def restart() -> None:
            restarts.append(len(got))
            got.clear()

        for item in stream_pages(rest, SLICES, page=10, on_restart=restart):
            got.append(_decoded(item))
    assert restarts == [10] and got == fleet_slices[:25]
    assert [c for c, _ in seen] == ["", "1", "", "1", "2"]


def test_status_takes_each_slice_once_where_the_list_starts_again(fleet_slices: list[dict[str, Any]]) -> None:
    """Status sorts each slice's devices as its page arrives (commands/status.py `SliceTaker`): where an expired
    continue token starts the LIST again, what was taken before counts for nothing, and a DeviceTaintRule's taint
    is on the devices it selects, as for the whole list at once."""
    from dra_driver.allocation.taints import apply_taint_rules
    from dra_driver.commands.status import SliceTaker, list_slices, status_slice
    from dra_driver.commands.statusview import build_status

    rule = {"metadata": {"name": "r"}, "spec": {"deviceSelector": {"device": "gpu-0"},
                                                "taint": {"key": "k", "value": "v", "effect": "NoSchedule"}}}
    taker = SliceTaker(DRIVER_NAME, [rule])
    with _server(_paged(fleet_slices[:25], 10), expire_once=True) as (rest, seen):
        listed = list_slices(rest, {}, pages=stream_pages(rest, SLICES, page=10), taking=taker)
    assert [c for c, _ in seen] == ["", "1", "", "1", "2"]
    expected = apply_taint_rules([status_slice(msgspec.json.encode(s)) for s in fleet_slices[:25]], [rule])
    assert listed == expected
    built = build_status(taker.fleet, [], [], driver=DRIVER_NAME)
    assert built == build_status(expected, [], [], driver=DRIVER_NAME)
    gpus = [gpu for node in built for gpu in node.gpus]
    assert sum(gpu.mig_devices for gpu in gpus) == sum(
        1 for s in fleet_slices[:25] for d in s["spec"].get("devices") or []
        if d["attributes"].get("type", {}).get("string") == "mig")
    assert {gpu.name for gpu in gpus if "k=v:NoSchedule" in gpu.taints} == {"gpu-0"}


def test_an_error_answer_is_an_api_error() -> None:
    with _server([b"not a list"]) as (rest, _), pytest.raises(ApiError, match="not a list"):
        list(stream_pages(rest, SLICES))


def test_the_first_page_is_asked_for_before_the_stream_is_read(fleet_slices: list[dict[str, Any]]) -> None:
    """A caller starts the LIST, then does its other work while the server encodes (explain)."""
    requested = threading.Event()
    with _server(_paged(fleet_slices, 10), requested=requested) as (rest, seen):
        pages = stream_pages(rest, SLICES, page=10)
        assert requested.wait(10), "no request before the stream was read"
        assert seen[0][0] == ""
        items = list(pages)
    assert [_decoded(i) for i in items] == fleet_slices


def test_a_stream_closed_unread_lets_its_fetcher_end(fleet_slices: list[dict[str, Any]]) -> None:
    with _server(_paged(fleet_slices, 10)) as (rest, _):
        pages = stream_pages(rest, SLICES, page=10)
        pages.close()
        fetcher = pages._fetcher
        fetcher.join(10)
        assert not fetcher.is_alive()
        assert list(pages) == []


def test_a_later_page_that_fails_raises_in_the_reader(fleet_slices: list[dict[str, Any]]) -> None:
    pages = _paged(fleet_slices[:15], 10)
    with _server([pages[0], b"not a list"]) as (rest, _):
        got = []
        with pytest.raises(ApiError, match="not a list"):
            for item in stream_pages(rest, SLICES, page=10):
                got.append(item)
    assert len(got) == 10


def test_a_judged_slice_needs_its_verdicts_while_the_sieve_judges() -> None:
    reach = claim_reach(claim("nine"), device_classes(DRIVER_NAME), cel=DraCelEnvironment())
    assert reach is not None
    sieve = PoolSieve(reach)
    assert sieve.judging((DRIVER_NAME, "pool"))  # counting per node: every slice is judged
    with pytest.raises(ValueError, match="without its verdicts"):
        sieve.add_judged((DRIVER_NAME, "pool"), "node", 1, None, b"{}")
