"""The parser's fast path and its cache shared across slices give exactly what the strict parser gives, and bad
input still fails with the strict parser's message whatever the cache holds."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from dra_driver.allocation.model import ParseCache, ResourceSlice, parse_slice
from dra_driver.defaults import DRIVER_NAME
from dra_driver.inventory.catalog import MigOffering, catalog
from dra_driver.inventory.discover import discover
from dra_driver.nvml.factory import open_backend
from dra_driver.resourceapi import InvalidObjectError
from dra_driver.slices.builder import SliceSettings, build_slices
from tests.allocation.objects import device, resource_slice


def _strict(obj: dict[str, Any]) -> ResourceSlice:
    """The strict parser's result: a field the fast path does not take (bindsToNode, here at its default) sends
    every device through it."""
    slow = copy.deepcopy(obj)
    for dev in slow["spec"].get("devices") or []:
        dev["bindsToNode"] = False
    return parse_slice(slow)


@pytest.mark.parametrize("preset", ["dgx-h100", "dgx-a100", "a30x4", "l4x2"])
def test_published_slices_parse_as_the_strict_parser_parses_them(preset: str) -> None:
    backend = open_backend(f"fake:{preset}")
    backend.init()
    inv = discover(backend)
    cache = ParseCache()
    for node in ("node-a", "node-b"):  # the second node's devices hit what the first one cached
        for obj in build_slices(inv.system, catalog(inv, MigOffering.DYNAMIC), SliceSettings(DRIVER_NAME, node), 1):
            assert parse_slice(obj, cache) == _strict(obj)


# Pairs of devices: the first one's content fills the cache, the second one differs only where a careless key
# would take it for the first.
LOOKALIKES = [
    ({"memory": "8"}, {"memory": 8}),  # an integer quantity is valid, but not the string's cache entry
    ({"memory": "8"}, {"memory": {"value": "8", "requestPolicy": {"default": "1"}}}),
    ({"memory": "8", "cores": "2"}, {"cores": "2", "memory": "8"}),  # same entries, other order
    ({"memory": "8"}, {"memory": {"value": "8", "unknownField": 1}}),
]


@pytest.mark.parametrize(("first", "second"), LOOKALIKES)
def test_capacities_that_only_look_alike_are_parsed_on_their_own(first: Any, second: Any) -> None:
    obj = resource_slice("s", [device("gpu-0", capacity=first), device("gpu-1", capacity=second)])
    assert parse_slice(obj, ParseCache()) == _strict(obj)


def test_counter_consumptions_that_only_look_alike_are_parsed_on_their_own() -> None:
    same = device("gpu-1", consumes=[("set", {"a": "1"})])
    reordered = device("gpu-2", consumes=[("set", {"a": "1"})])
    reordered["consumesCounters"][0] = {"counters": {"a": {"value": "1"}}, "counterSet": "set"}
    integer = device("gpu-3", consumes=[("set", {"a": "1"})])
    integer["consumesCounters"][0]["counters"]["a"]["value"] = 1
    no_counters = device("gpu-4")
    no_counters["consumesCounters"] = [{"counterSet": "set"}]
    devices = [device("gpu-0", consumes=[("set", {"a": "1"})]), same, reordered, integer, no_counters]
    obj = resource_slice("s", devices)
    parsed = parse_slice(obj, ParseCache())
    assert parsed == _strict(obj)
    assert parsed.devices[4].consumes_counters[0].counters == {}


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (device("gpu-1", capacity={"memory": "lots"}), "spec.devices[1].capacity.memory.value: invalid quantity 'lots'"),
        (
            device("gpu-1", consumes=[("set", {"a": "x"})]),
            "spec.devices[1].consumesCounters[0].counters.a.value: invalid quantity 'x'",
        ),
        (
            {**device("gpu-1"), "attributes": {"index": {"int": True}}},
            "spec.devices[1].attributes.index.int: must be an integer, got bool True",
        ),
        ({**device("gpu-1"), "capacity": {"memory": {"value": True}}}, "spec.devices[1].capacity.memory.value"),
    ],
)
def test_bad_input_fails_with_the_strict_message_whatever_the_cache_holds(bad: Any, message: str) -> None:
    good = device("gpu-0", {"index": 0}, {"memory": "8"}, consumes=[("set", {"a": "1"})])
    cache = ParseCache()
    parse_slice(resource_slice("warm", [good]), cache)
    with pytest.raises(InvalidObjectError) as err:
        parse_slice(resource_slice("s", [good, bad]), cache)
    assert message in str(err.value)


def test_shared_pieces_are_one_object() -> None:
    cache = ParseCache()
    one = parse_slice(resource_slice("a", [device("gpu-0", capacity={"memory": "8"}, consumes=[("s", {"a": "1"})])]), cache)
    two = parse_slice(resource_slice("b", [device("gpu-0", capacity={"memory": "8"}, consumes=[("s", {"a": "1"})])]), cache)
    assert one.devices[0].capacity is two.devices[0].capacity
    assert one.devices[0].consumes_counters is two.devices[0].consumes_counters
