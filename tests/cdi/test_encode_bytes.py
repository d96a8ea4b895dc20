"""The CDI spec's JSON text is exactly what `json.dumps(..., indent=2)` writes (the bytes on disk did not change
when the encoder did: a repeated prepare compares the file with a fresh rendering, byte for byte)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dra_driver.cdi import ContainerEdits, Device, DeviceNode, Hook, IntelRdt, Mount, Spec, spec_to_dict, spec_to_json
from dra_driver.cdi.encode import _indented, indented_text

# Every text shape json escapes differently: quotes, backslashes, control characters, non-ASCII, astral planes.
text = st.text(st.characters(codec="utf-8"), max_size=12) | st.sampled_from(
    ['"', "\\", "\n\t\x00\x1f", "é", "\u2028", "😀", ""]
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
    max_leaves=25,
)


def indented(value: Any, indent: int = 2) -> str:
    parts: list[str] = []
    _indented(value, "", " " * indent, parts)
    return "".join(parts)


@settings(max_examples=300, deadline=None)
@given(json_values, st.sampled_from([1, 2, 4]))
def test_any_json_value_is_written_as_json_dumps_indents_it(value: Any, indent: int) -> None:
    assert indented(value, indent) == json.dumps(value, indent=indent)


def test_a_full_spec_is_byte_identical_to_json_dumps_and_compact_is_the_c_encoders() -> None:
    edits = ContainerEdits(
        env=("A=1", "NVIDIA_VISIBLE_DEVICES=GPU-ü"),
        device_nodes=(DeviceNode("/dev/nvidia0", host_path="/dev/nvidia0", type="c", major=195, minor=0, uid=0),),
        hooks=(Hook("createContainer", "/usr/bin/hook", args=("hook", "--x"), env=("B=2",), timeout=5),),
        mounts=(Mount("/host/lib.so", "/usr/local/nvidia/lib64/lib.so", ("ro", "nosuid", "nodev", "bind")),),
        intel_rdt=IntelRdt(clos_id="c1", schemata=("L3:0=f",), enable_monitoring=True),
        additional_gids=(44, 109),
    )
    spec = Spec("1.1.0", "k8s.gpu.dra.dev/claim", (Device("0abc-gpu-0", edits, {"note": "x"}),), edits)
    assert spec_to_json(spec) == json.dumps(spec_to_dict(spec), indent=2) + "\n"
    assert spec_to_json(spec, indent=None) == json.dumps(spec_to_dict(spec)) + "\n"


def test_a_value_json_cannot_hold_is_refused() -> None:
    with pytest.raises(TypeError, match="float"):
        indented({"a": [1.5]})


@settings(max_examples=300, deadline=None)
@given(json_values, st.sampled_from([1, 2, 4]))
def test_the_fast_path_writes_any_json_value_as_json_dumps_indents_it(value: Any, indent: int) -> None:
    """`indented_text` (msgspec where no string needs an escape, `_indented` otherwise) is json.dumps's text too."""
    assert indented_text(value, indent) == json.dumps(value, indent=indent)


@pytest.mark.parametrize("text", ["plain/ascii path", "tab\there", "del\x7f", "é", 'quote"', "back\\slash", "<&>"])
def test_the_fast_path_and_the_fallback_agree_on_every_kind_of_string(text: str) -> None:
    value = {"env": [text, "A=1"], "n": [0, -1, 2**63 - 1], "empty": {}, "none": [], "x": None, "t": True}
    assert indented_text(value, 2) == json.dumps(value, indent=2) == indented(value, 2)
