"""Per-feature minimum cdiVersion: every threshold, both sides of it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dra_driver.cdi import KNOWN_VERSIONS, CdiError, minimum_version
from dra_sandbox.runtime.cdi import load_spec
from dra_sandbox.runtime.cdi.decode import decode_spec

PREVIOUS = {KNOWN_VERSIONS[i]: KNOWN_VERSIONS[i - 1] for i in range(1, len(KNOWN_VERSIONS))}


def doc(kind: str = "example.com/gpu", name: str = "gpu0", edits: dict[str, Any] | None = None,
        **top: Any) -> dict[str, Any]:
    return {
        "cdiVersion": "1.1.0",
        "kind": kind,
        "devices": [{"name": name, "containerEdits": edits or {"env": ["A=1"]}}],
        **top,
    }


# (description, spec document, minimum version, field named when the version is too low)
FEATURES: list[tuple[str, dict[str, Any], str, str]] = [
    ("plain", doc(), "0.3.0", ""),
    ("mount type", doc(edits={"mounts": [{"hostPath": "/a", "containerPath": "/b", "type": "bind"}]}), "0.4.0",
     "devices[0].containerEdits.mounts[0].type"),
    ("deviceNode hostPath", doc(edits={"deviceNodes": [{"path": "/dev/a", "hostPath": "/dev/b"}]}), "0.5.0",
     "devices[0].containerEdits.deviceNodes[0].hostPath"),
    ("device name starting with a digit", doc(name="0"), "0.5.0", "devices[0].name"),
    ("spec annotations", doc(annotations={"a": "b"}), "0.6.0", "annotations"),
    ("device annotations", {**doc(), "devices": [{"name": "d", "annotations": {"a": "b"},
                                                   "containerEdits": {"env": ["A=1"]}}]}, "0.6.0",
     "devices[0].annotations"),
    ("dot in class", doc(kind="example.com/gpu.mig"), "0.6.0", "kind"),
    ("intelRdt", doc(edits={"intelRdt": {"closID": "x"}}), "0.7.0", "devices[0].containerEdits.intelRdt"),
    ("additionalGids", doc(edits={"additionalGids": [5]}), "0.7.0", "devices[0].containerEdits.additionalGids"),
    ("spec-level additionalGids", doc(containerEdits={"additionalGids": [5]}), "0.7.0",
     "containerEdits.additionalGids"),
    ("netDevices", doc(edits={"netDevices": [{"hostInterfaceName": "eth0", "name": "n0"}]}), "1.1.0",
     "devices[0].containerEdits.netDevices"),
    ("intelRdt.schemata", doc(edits={"intelRdt": {"schemata": ["L3:0=f"]}}), "1.1.0",
     "devices[0].containerEdits.intelRdt.schemata"),
    ("intelRdt.enableMonitoring", doc(edits={"intelRdt": {"enableMonitoring": True}}), "1.1.0",
     "devices[0].containerEdits.intelRdt.enableMonitoring"),
]


@pytest.mark.parametrize(("what", "document", "minimum", "field"), FEATURES, ids=[f[0] for f in FEATURES])
def test_minimum_version_and_threshold(what: str, document: dict[str, Any], minimum: str, field: str) -> None:
    assert minimum_version(decode_spec(document)) == minimum
    # Exactly the minimum is accepted ...
    assert load_spec(json.dumps({**document, "cdiVersion": minimum})).cdi_version == minimum
    # ... and the version just below it is rejected, naming the field that needs more.
    if minimum != "0.3.0":
        with pytest.raises(CdiError) as err:
            load_spec(json.dumps({**document, "cdiVersion": PREVIOUS[minimum]}))
        assert err.value.field == field
        assert f"needs cdiVersion >= {minimum}" in err.value.message
        assert f"raise cdiVersion to {minimum}" in err.value.message


def test_highest_feature_wins() -> None:
    document = doc(name="0", edits={"additionalGids": [5], "mounts": [{"hostPath": "/a", "containerPath": "/b",
                                                                          "type": "bind"}]})
    assert minimum_version(decode_spec(document)) == "0.7.0"
    with pytest.raises(CdiError) as err:
        load_spec(json.dumps({**document, "cdiVersion": "0.5.0"}))
    assert "0.7.0" in err.value.message


@pytest.mark.parametrize("version", ["0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0"])
def test_every_supported_version_accepted(version: str) -> None:
    assert load_spec(json.dumps({**doc(), "cdiVersion": version})).cdi_version == version


@pytest.mark.parametrize("version", ["0.1.0", "0.2.0", "1.2.0", "2.0.0", "0.5", "", "latest"])
def test_unsupported_or_unknown_versions_rejected(version: str) -> None:
    with pytest.raises(CdiError) as err:
        load_spec(json.dumps({**doc(), "cdiVersion": version}))
    assert err.value.field == "cdiVersion"
