"""Registry over spec directories: priority, same-priority conflicts, invalid files, resolve()."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dra_driver.cdi import ContainerEdits
from dra_sandbox.runtime.cdi import UnresolvableDevicesError, load_registry


def spec(kind: str, devices: dict[str, list[str]], spec_env: list[str] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "cdiVersion": "0.5.0",
        "kind": kind,
        "devices": [{"name": n, "containerEdits": {"env": env}} for n, env in devices.items()],
    }
    if spec_env:
        out["containerEdits"] = {"env": spec_env}
    return out


def put(directory: Path, name: str, doc: dict[str, Any] | str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return path


def test_later_directory_wins(tmp_path: Path) -> None:
    static, dynamic = tmp_path / "etc", tmp_path / "run"
    put(static, "a.json", spec("example.com/gpu", {"g0": ["FROM=etc"], "g1": ["ONLY=etc"]}))
    put(dynamic, "a.json", spec("example.com/gpu", {"g0": ["FROM=run"]}))
    registry = load_registry([static, dynamic])
    assert registry.resolve(["example.com/gpu=g0"]).env == ("FROM=run",)
    assert registry.resolve(["example.com/gpu=g1"]).env == ("ONLY=etc",)
    assert registry.issues == ()


def test_same_priority_conflict_drops_device_and_reports_both_files(tmp_path: Path) -> None:
    d = tmp_path / "run"
    put(d, "one.json", spec("example.com/gpu", {"g0": ["X=1"], "g1": ["Y=1"]}))
    put(d, "two.yaml", "cdiVersion: 0.5.0\nkind: example.com/gpu\ndevices:\n- name: g0\n  containerEdits:\n"
                       "    env: [X=2]\n")
    registry = load_registry([d])
    assert "example.com/gpu=g0" not in registry.devices
    assert registry.resolve(["example.com/gpu=g1"]).env == ("Y=1",)
    assert sorted(Path(i.path).name for i in registry.issues) == ["one.json", "two.yaml"]
    with pytest.raises(UnresolvableDevicesError) as err:
        registry.resolve(["example.com/gpu=g0"])
    assert "same priority" in str(err.value)


def test_conflict_below_a_higher_priority_definition_is_resolved_by_it(tmp_path: Path) -> None:
    low, high = tmp_path / "etc", tmp_path / "run"
    put(low, "a.json", spec("example.com/gpu", {"g0": ["X=a"]}))
    put(low, "b.json", spec("example.com/gpu", {"g0": ["X=b"]}))
    put(high, "c.json", spec("example.com/gpu", {"g0": ["X=c"]}))
    assert load_registry([low, high]).resolve(["example.com/gpu=g0"]).env == ("X=c",)


def test_invalid_and_foreign_files_are_skipped_with_issues(tmp_path: Path) -> None:
    d = tmp_path / "run"
    put(d, "good.json", spec("example.com/gpu", {"g0": ["OK=1"]}))
    put(d, "bad.json", spec("example.com/gpu", {"g1": ["NOEQ"]}))
    put(d, "ignored.txt", "not a spec")
    (d / "subdir.json").mkdir()
    registry = load_registry([d, tmp_path / "missing"])
    assert list(registry.devices) == ["example.com/gpu=g0"]
    [issue] = registry.issues
    assert issue.path.endswith("bad.json") and "devices[0].containerEdits.env[0]" in issue.message


def test_resolve_merges_spec_edits_once_then_device_edits(tmp_path: Path) -> None:
    d = tmp_path / "run"
    put(d, "gpu.json", spec("example.com/gpu", {"g0": ["D0=1"], "g1": ["D1=1"]}, spec_env=["SPEC=gpu"]))
    put(d, "net.json", spec("example.com/nic", {"n0": ["N0=1"]}, spec_env=["SPEC=nic"]))
    edits = load_registry([d]).resolve(["example.com/gpu=g0", "example.com/nic=n0", "example.com/gpu=g1"])
    assert edits == ContainerEdits(env=("SPEC=gpu", "D0=1", "SPEC=nic", "N0=1", "D1=1"))


def test_resolve_reports_every_missing_id(tmp_path: Path) -> None:
    d = tmp_path / "run"
    put(d, "gpu.json", spec("example.com/gpu", {"g0": ["D0=1"]}))
    with pytest.raises(UnresolvableDevicesError) as err:
        load_registry([d]).resolve(["example.com/gpu=g0", "example.com/gpu=nope", "not-qualified"])
    assert err.value.missing == ("example.com/gpu=nope", "not-qualified")
    assert "unresolvable CDI devices" in str(err.value)
