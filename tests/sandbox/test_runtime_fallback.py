"""The "CDI checked, not executed" runtime and runtime selection."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import pytest

from dra_sandbox.runtime import CdiCheckedRuntime, ContainerRequest, PodmanRuntime, select_runtime
from dra_sandbox.runtime.cdicheck import NOT_EXECUTED_NOTE
from dra_sandbox.runtime.types import ObservedDevice, ObservedMount

SPEC = {
    "cdiVersion": "0.5.0",
    "kind": "sandbox.test/gpu",
    "containerEdits": {"env": ["FROM_SPEC=1"]},
    "devices": [
        {
            "name": "gpu0",
            "containerEdits": {
                "env": ["GPU_INDEX=0", "SHARED=dev"],
                "mounts": [{"hostPath": "/opt/driver", "containerPath": "/usr/local/driver", "options": ["ro"]}],
                "deviceNodes": [{"path": "/dev/gpu0", "hostPath": "/dev/null"}, {"path": "/dev/fake", "type": "c",
                                                                                "major": 195, "minor": 0}],
            },
        }
    ],
}


def write(dir_: Path, spec: Mapping[str, object]) -> None:
    dir_.mkdir(parents=True, exist_ok=True)
    (dir_ / "sandbox.test-gpu.json").write_text(json.dumps(spec))


def test_fallback_reports_resolved_edits_as_not_executed(tmp_path: Path) -> None:
    write(tmp_path / "run", SPEC)
    runtime = CdiCheckedRuntime([tmp_path / "etc", tmp_path / "run"], reason="podman missing")
    result = runtime.run(ContainerRequest("c", ("sandbox.test/gpu=gpu0",), env=(("SHARED", "pod"), ("X", "1"))))
    assert result.ok and result.executed is False and result.runtime == "cdi-check"
    assert NOT_EXECUTED_NOTE in result.note and "podman missing" in result.note
    # Pod env first, then CDI edits override a variable of the same name (as runtimes apply them).
    assert result.env["SHARED"] == "dev" and result.env["X"] == "1"
    assert result.env["FROM_SPEC"] == "1" and result.env["GPU_INDEX"] == "0"
    assert result.mounts == (ObservedMount("/usr/local/driver", "/opt/driver", "bind", ("ro",)),)
    # Missing type/major/minor come from the host node (/dev/null is c 1:3); explicit ones are kept.
    assert result.device_nodes == (ObservedDevice("/dev/gpu0", "c", 1, 3), ObservedDevice("/dev/fake", "c", 195, 0))
    record = result.to_json()
    assert record["executed"] is False and record["cdiDevices"] == ["sandbox.test/gpu=gpu0"]


def test_fallback_unknown_device_is_a_start_error(tmp_path: Path) -> None:
    write(tmp_path / "run", SPEC)
    result = CdiCheckedRuntime([tmp_path / "run"]).run(ContainerRequest("c", ("sandbox.test/gpu=gpu9",)))
    assert not result.ok and result.exit_code == 128
    assert result.error is not None and "sandbox.test/gpu=gpu9" in result.error


def test_fallback_invalid_spec_is_not_used(tmp_path: Path) -> None:
    bad = json.loads(json.dumps(SPEC))
    bad["cdiVersion"] = "0.4.0"  # hostPath needs 0.5.0: the whole spec is rejected
    write(tmp_path / "run", bad)
    result = CdiCheckedRuntime([tmp_path / "run"]).run(ContainerRequest("c", ("sandbox.test/gpu=gpu0",)))
    assert not result.ok and result.error is not None and "unresolvable" in result.error


def test_select_runtime_modes(tmp_path: Path) -> None:
    assert select_runtime("cdi-check", cdi_dirs=[tmp_path]).name == "cdi-check"
    assert select_runtime("podman", cache_dir=tmp_path).name == "podman"
    with pytest.raises(ValueError, match="runtime mode"):
        select_runtime("docker")


def test_auto_falls_back_when_podman_is_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import dra_sandbox.runtime.choose as choose

    class Missing(PodmanRuntime):
        def __init__(self, **_: object) -> None:
            super().__init__(podman="definitely-not-podman-xyz", cache_dir=tmp_path)

    monkeypatch.setattr(choose, "PodmanRuntime", Missing)
    runtime = select_runtime("auto", cdi_dirs=[tmp_path])
    assert isinstance(runtime, CdiCheckedRuntime)
    assert "not installed" in runtime.reason


def test_unusable_podman_fails_each_container_with_reason(tmp_path: Path) -> None:
    runtime = PodmanRuntime(podman="definitely-not-podman-xyz", cache_dir=tmp_path)
    result = runtime.run(ContainerRequest("c"))
    assert not result.ok and result.executed is False
    assert result.error is not None and "not installed" in result.error
