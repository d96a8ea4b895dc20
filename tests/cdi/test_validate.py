"""Strict parsing and validation: one case per rule, each naming the field it reports."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from dra_driver.cdi import CdiError, spec_to_dict, spec_to_json
from dra_sandbox.runtime.cdi import load_spec


def base() -> dict[str, Any]:
    return {
        "cdiVersion": "0.3.0",
        "kind": "example.com/gpu",
        "devices": [{"name": "gpu0", "containerEdits": {"env": ["GPU=0"]}}],
    }


def with_change(path: str, value: Any) -> dict[str, Any]:
    """base() with `path` (dotted, [i] for list items) set to `value`; missing objects are created."""
    doc = base()
    node: Any = doc
    parts = path.replace("[", ".[").split(".")
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        key: Any = int(part[1:-1]) if part.startswith("[") else part
        if last:
            node[key] = value
        else:
            if isinstance(key, str) and key not in node:
                node[key] = {}
            node = node[key]
    return doc


def test_minimal_spec_parses_to_model() -> None:
    spec = load_spec(json.dumps(base()))
    assert spec.kind == "example.com/gpu"
    assert spec.vendor == "example.com" and spec.device_class == "gpu"
    assert spec.devices[0].container_edits.env == ("GPU=0",)
    assert spec.qualified_names() == ("example.com/gpu=gpu0",)


FULL = {
    "cdiVersion": "1.1.0",
    "kind": "example.com/gpu.mig",
    "annotations": {"example.com/owner": "test"},
    "containerEdits": {
        "env": ["A=1"],
        "hooks": [{"hookName": "createContainer", "path": "/bin/hook", "args": ["hook", "x"], "env": ["H=1"],
                   "timeout": 5}],
    },
    "devices": [
        {
            "name": "0",
            "annotations": {"note": "first"},
            "containerEdits": {
                "deviceNodes": [{"path": "/dev/gpu0", "hostPath": "/dev/null", "type": "c", "major": 1, "minor": 3,
                                 "fileMode": 438, "permissions": "rw", "uid": 0, "gid": 0}],
                "mounts": [{"hostPath": "/lib", "containerPath": "/usr/lib/x", "options": ["ro", "bind"],
                            "type": "bind"}],
                "additionalGids": [44],
                "intelRdt": {"closID": "c1", "l3CacheSchema": "L3:0=f", "memBwSchema": "MB:0=50",
                             "schemata": ["L2:0=3"], "enableMonitoring": True},
                "netDevices": [{"hostInterfaceName": "eth1", "name": "net0"}],
            },
        }
    ],
}


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_full_spec_round_trips(fmt: str) -> None:
    import yaml

    text = json.dumps(FULL) if fmt == "json" else yaml.safe_dump(FULL)
    spec = load_spec(text, fmt)
    assert spec_to_dict(spec) == FULL
    assert load_spec(spec_to_json(spec)) == spec
    node = spec.devices[0].container_edits.device_nodes[0]
    assert (node.host_path, node.major, node.minor, node.file_mode) == ("/dev/null", 1, 3, 438)
    assert spec.devices[0].container_edits.intel_rdt is not None
    assert spec.devices[0].container_edits.intel_rdt.enable_monitoring is True


# (change path, value, expected field, fragment of the message)
INVALID: list[tuple[str, Any, str, str]] = [
    ("cdiVersion", "0.9.0", "cdiVersion", "unknown cdiVersion"),
    ("cdiVersion", "v0.5.0", "cdiVersion", "unknown cdiVersion"),
    ("cdiVersion", "0.2.0", "cdiVersion", "no longer supported"),
    ("cdiVersion", 0.5, "cdiVersion", "must be a string"),
    ("kind", "example.com", "kind", "exactly one '/'"),
    ("kind", "example.com/", "kind", "class is empty"),
    ("kind", "-example.com/gpu", "kind", "invalid vendor"),
    ("kind", "example.com/gpu-", "kind", "invalid class"),
    ("kind", 3, "kind", "must be a string"),
    ("devices", [], "devices", "at least one device"),
    ("devices", {}, "devices", "must be a list"),
    ("devices[0].name", "", "devices[0].name", "device name is empty"),
    ("devices[0].name", "gpu 0", "devices[0].name", "invalid device name"),
    ("devices[0].containerEdits", {}, "devices[0].containerEdits", "at least one container edit"),
    ("devices[0].containerEdits.env", ["NOEQUALS"], "devices[0].containerEdits.env[0]", "NAME=value"),
    ("devices[0].containerEdits.env", ["=x"], "devices[0].containerEdits.env[0]", "NAME=value"),
    ("devices[0].containerEdits.env", "A=1", "devices[0].containerEdits.env", "must be a list"),
    ("devices[0].containerEdits.deviceNodes", [{}], "devices[0].containerEdits.deviceNodes[0].path", "required"),
    ("devices[0].containerEdits.deviceNodes", [{"path": ""}], "devices[0].containerEdits.deviceNodes[0].path",
     "empty"),
    ("devices[0].containerEdits.deviceNodes", [{"path": "dev/x"}], "devices[0].containerEdits.deviceNodes[0].path",
     "absolute"),
    ("devices[0].containerEdits.deviceNodes", [{"path": "/dev/x", "type": "x"}],
     "devices[0].containerEdits.deviceNodes[0].type", "invalid device type"),
    ("devices[0].containerEdits.deviceNodes", [{"path": "/dev/x", "permissions": "rwx"}],
     "devices[0].containerEdits.deviceNodes[0].permissions", "subset of 'rwm'"),
    ("devices[0].containerEdits.deviceNodes", [{"path": "/dev/x", "permissions": "rr"}],
     "devices[0].containerEdits.deviceNodes[0].permissions", "subset of 'rwm'"),
    ("devices[0].containerEdits.deviceNodes", [{"path": "/dev/x", "major": "1"}],
     "devices[0].containerEdits.deviceNodes[0].major", "must be an integer"),
    ("devices[0].containerEdits.deviceNodes", [{"path": "/dev/x", "major": True}],
     "devices[0].containerEdits.deviceNodes[0].major", "must be an integer"),
    ("devices[0].containerEdits.deviceNodes", [{"path": "/dev/x", "uid": -1}],
     "devices[0].containerEdits.deviceNodes[0].uid", "between 0 and 4294967295, got -1"),
    ("devices[0].containerEdits.mounts", [{"containerPath": "/x"}], "devices[0].containerEdits.mounts[0].hostPath",
     "required"),
    ("devices[0].containerEdits.mounts", [{"hostPath": "/x", "containerPath": ""}],
     "devices[0].containerEdits.mounts[0].containerPath", "empty"),
    ("devices[0].containerEdits.mounts", [{"hostPath": "/x", "containerPath": "/y", "options": "ro"}],
     "devices[0].containerEdits.mounts[0].options", "must be a list"),
    ("devices[0].containerEdits.hooks", [{"hookName": "preStart", "path": "/bin/h"}],
     "devices[0].containerEdits.hooks[0].hookName", "invalid hook name"),
    ("devices[0].containerEdits.hooks", [{"hookName": "prestart", "path": "bin/h"}],
     "devices[0].containerEdits.hooks[0].path", "absolute"),
    ("devices[0].containerEdits.hooks", [{"hookName": "prestart", "path": "/h", "timeout": 0}],
     "devices[0].containerEdits.hooks[0].timeout", "positive"),
    ("devices[0].containerEdits.hooks", [{"hookName": "prestart", "path": "/h", "env": ["X"]}],
     "devices[0].containerEdits.hooks[0].env[0]", "NAME=value"),
    ("devices[0].containerEdits.additionalGids", [-5], "devices[0].containerEdits.additionalGids[0]",
     "between 0 and 4294967295, got -5"),
    ("devices[0].containerEdits.netDevices", [{"hostInterfaceName": "eth/0", "name": "n"}],
     "devices[0].containerEdits.netDevices[0].hostInterfaceName", "invalid interface name"),
    ("devices[0].containerEdits.netDevices",
     [{"hostInterfaceName": "a", "name": "n"}, {"hostInterfaceName": "b", "name": "n"}],
     "devices[0].containerEdits.netDevices[1].name", "duplicate"),
    ("devices[0].containerEdits.intelRdt", {"closID": ".."}, "devices[0].containerEdits.intelRdt.closID",
     "plain file name"),
    ("devices[0].containerEdits.intelRdt", {"enableMonitoring": "yes"},
     "devices[0].containerEdits.intelRdt.enableMonitoring", "must be a boolean"),
    ("annotations", {"bad key!": "x"}, "annotations['bad key!']", "annotation key"),
    ("annotations", {"Upper.Case/x": "x"}, "annotations['Upper.Case/x']", "DNS subdomain"),
    ("annotations", {"/x": "x"}, "annotations['/x']", "DNS subdomain"),
    ("annotations", {"x" * 64: "x"}, f"annotations['{'x' * 64}']", "1-63 characters"),
    # A trailing newline is not part of a valid key (a `$`-anchored pattern used to let it through).
    ("annotations", {"key\n": "x"}, "annotations['key\\n']", "annotation key"),
    ("annotations", {"example.com\n/key": "x"}, "annotations['example.com\\n/key']", "DNS subdomain"),
    ("devices[0].annotations", {"k": 1}, "devices[0].annotations['k']", "must be a string"),
    ("containerEdits.env", ["BROKEN"], "containerEdits.env[0]", "NAME=value"),
]


@pytest.mark.parametrize(("path", "value", "field", "needle"), INVALID, ids=[f"{c[0]}={c[1]!r}" for c in INVALID])
def test_invalid_spec_is_rejected_with_field(path: str, value: Any, field: str, needle: str) -> None:
    doc = with_change(path, value)
    # Give version-gated features a version that allows them, so each case tests exactly one rule.
    if path != "cdiVersion":
        doc["cdiVersion"] = "1.1.0"
    with pytest.raises(CdiError) as err:
        load_spec(json.dumps(doc))
    assert err.value.field == field, str(err.value)
    assert needle in err.value.message


@pytest.mark.parametrize(
    ("doc", "field", "needle"),
    [
        ({"kind": "a/b", "devices": []}, "cdiVersion", "required"),
        ({"cdiVersion": "0.3.0", "devices": []}, "kind", "required"),
        ({"cdiVersion": "0.3.0", "kind": "a/b"}, "devices", "required"),
        (
            {**base(), "extra": 1},
            "extra",
            "unknown field; allowed fields: cdiVersion, kind, annotations, devices, containerEdits",
        ),
        ([], "", "must be an object, got a list"),
    ],
)
def test_shape_errors(doc: Any, field: str, needle: str) -> None:
    with pytest.raises(CdiError) as err:
        load_spec(json.dumps(doc))
    assert err.value.field == field
    assert needle in err.value.message


def test_unknown_nested_field_is_rejected() -> None:
    doc = base()
    doc["devices"][0]["containerEdits"]["mounts"] = [{"hostPath": "/a", "containerPath": "/b", "readOnly": True}]
    with pytest.raises(CdiError) as err:
        load_spec(json.dumps(doc))
    assert err.value.field == "devices[0].containerEdits.mounts[0].readOnly"
    assert err.value.message == "unknown field; allowed fields: hostPath, containerPath, options, type"


def test_null_leaves_an_optional_field_empty_as_in_go() -> None:
    doc = base()
    doc["annotations"] = None
    doc["devices"][0]["containerEdits"] = {"env": ["A=1"], "mounts": None, "deviceNodes": [{"path": "/dev/x", "uid": None}]}
    spec = load_spec(json.dumps(doc))
    assert spec.annotations == {} and spec.devices[0].container_edits.mounts == ()
    assert spec.devices[0].container_edits.device_nodes[0].uid is None


def test_every_shape_problem_is_reported() -> None:
    doc = base()
    doc["devices"][0]["containerEdits"]["deviceNodes"] = [{"major": "1"}]
    doc["kind"] = 3
    with pytest.raises(CdiError) as err:
        load_spec(json.dumps(doc))
    assert [str(p) for p in err.value.problems] == [
        "kind: must be a string, got an integer 3",
        "devices[0].containerEdits.deviceNodes[0].path: required field is missing (the device path inside the "
        "container, e.g. /dev/nvidia0)",
        "devices[0].containerEdits.deviceNodes[0].major: must be an integer, got a string '1'",
    ]


def test_duplicate_device_names_rejected() -> None:
    doc = base()
    doc["devices"].append(copy.deepcopy(doc["devices"][0]))
    with pytest.raises(CdiError) as err:
        load_spec(json.dumps(doc))
    assert err.value.field == "devices[1].name"
    assert "duplicate" in err.value.message


@pytest.mark.parametrize(
    ("text", "fmt"),
    [
        ('{"cdiVersion": "0.3.0", "cdiVersion": "0.4.0", "kind": "a/b", "devices": []}', "json"),
        ("cdiVersion: 0.3.0\ncdiVersion: 0.4.0\nkind: a/b\ndevices: []\n", "yaml"),
    ],
)
def test_duplicate_keys_rejected(text: str, fmt: str) -> None:
    with pytest.raises(CdiError, match="duplicate key 'cdiVersion'"):
        load_spec(text, fmt)


def test_syntax_errors_are_cdi_errors() -> None:
    with pytest.raises(CdiError, match="invalid JSON"):
        load_spec("{not json", "json")
    with pytest.raises(CdiError, match="invalid YAML"):
        load_spec("a: [b", "yaml")
    with pytest.raises(CdiError, match="not UTF-8"):
        load_spec(b"\xff\xfe", None)


def test_yaml_unquoted_version_is_a_type_error() -> None:
    # YAML reads 0.5 as a float: the error must say it needs a string, not crash.
    with pytest.raises(CdiError) as err:
        load_spec("cdiVersion: 0.5\nkind: a/b\ndevices: [{name: x, containerEdits: {env: [A=1]}}]\n", "yaml")
    assert err.value.field == "cdiVersion"
