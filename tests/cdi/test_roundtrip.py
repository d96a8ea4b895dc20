"""Property tests: names and specs survive format -> parse, and minimum_version is always accepted."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from dra_driver.cdi import (
    ContainerEdits,
    Device,
    DeviceNode,
    Mount,
    Spec,
    minimum_version,
    parse_qualified_name,
    spec_to_json,
)
from dra_sandbox.runtime.cdi import load_spec

ALNUM = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
LETTERS = ALNUM[:52]
vendor_class = st.builds(
    lambda first, mid, last: first + mid + last,
    st.sampled_from(LETTERS),
    st.text(ALNUM + "-_.", max_size=10),
    st.sampled_from(ALNUM),
)
device_name = st.builds(lambda first, mid: first + mid, st.sampled_from(ALNUM), st.text(ALNUM, max_size=8))
paths = st.lists(st.text("abcxyz", min_size=1, max_size=5), min_size=1, max_size=3).map(lambda p: "/" + "/".join(p))
env = st.builds(lambda k, v: f"{k}={v}", st.text(LETTERS + "_", min_size=1, max_size=6), st.text(ALNUM, max_size=6))
edits = st.builds(
    ContainerEdits,
    env=st.lists(env, min_size=1, max_size=3).map(tuple),
    mounts=st.lists(
        st.builds(Mount, paths, paths, st.just(("ro", "bind")), st.sampled_from([None, "bind"])), max_size=2
    ).map(tuple),
    device_nodes=st.lists(st.builds(DeviceNode, paths, host_path=st.sampled_from([None, "/dev/null"])), max_size=2).map(
        tuple
    ),
    additional_gids=st.lists(st.integers(1, 65535), max_size=2).map(tuple),
)


@settings(max_examples=60, deadline=None)
@given(vendor_class, vendor_class, device_name)
def test_qualified_name_round_trip(vendor: str, device_class: str, name: str) -> None:
    parsed = parse_qualified_name(f"{vendor}/{device_class}={name}")
    assert (parsed.vendor, parsed.device_class, parsed.name) == (vendor, device_class, name)


@settings(max_examples=60, deadline=None)
@given(vendor_class, vendor_class, st.dictionaries(device_name, edits, min_size=1, max_size=3))
def test_spec_round_trip_at_minimum_version(vendor: str, device_class: str, devices: dict[str, ContainerEdits]) -> None:
    draft = Spec("1.1.0", f"{vendor}/{device_class}", tuple(Device(n, e) for n, e in devices.items()))
    spec = Spec(minimum_version(draft), draft.kind, draft.devices)
    assert load_spec(spec_to_json(spec)) == spec
