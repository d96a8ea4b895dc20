"""REAL containers: podman injects a CDI spec from /var/run/cdi and the probe reports what it saw.

Skipped (with the reason) only where podman cannot run containers or /var/run/cdi is not writable.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_sandbox.runtime import ContainerRequest, PodmanRuntime

pytestmark = pytest.mark.podman
CDI_DIR = Path("/var/run/cdi")


@pytest.fixture(scope="module")
def podman() -> Iterator[PodmanRuntime]:
    work_dir = Path(tempfile.mkdtemp(prefix="dra-rt-", dir="/tmp"))
    try:
        runtime = PodmanRuntime(work_dir=work_dir)
        availability = runtime.availability()
        if not availability.usable:
            pytest.skip(f"podman not usable: {availability.reason}")
        try:
            CDI_DIR.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            pytest.skip(f"cannot create {CDI_DIR} (podman reads CDI specs only there and in /etc/cdi): {exc}")
        if not os.access(CDI_DIR, os.W_OK):
            pytest.skip(f"{CDI_DIR} is not writable (needs root)")
        yield runtime
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)


@pytest.fixture
def kind() -> str:
    # A vendor unique per test run, so parallel runs and leftovers never collide.
    return f"test-{uuid.uuid4().hex[:10]}.sandbox.dra.dev/probe"


@pytest.fixture
def spec_file(kind: str) -> Iterator[Path]:
    path = CDI_DIR / f"{kind.replace('/', '-')}.json"
    yield path
    path.unlink(missing_ok=True)


def test_container_sees_cdi_env_mount_and_device(podman: PodmanRuntime, kind: str, spec_file: Path,
                                                  tmp_path: Path) -> None:
    shared = tmp_path / "driver-libs"
    shared.mkdir()
    (shared / "marker").write_text("from-the-host\n")
    spec = {
        "cdiVersion": "0.5.0",
        "kind": kind,
        "containerEdits": {"env": ["SANDBOX_SPEC_LEVEL=yes"]},
        "devices": [
            {
                "name": "gpu0",
                "containerEdits": {
                    "env": ["SANDBOX_GPU=gpu0", "SANDBOX_OVERRIDE=cdi"],
                    "mounts": [{"hostPath": str(shared), "containerPath": "/usr/local/gpu-libs",
                                "options": ["ro", "nosuid", "nodev", "bind"]}],
                    "deviceNodes": [{"path": "/dev/sandbox-gpu0", "hostPath": "/dev/null"}],
                },
            }
        ],
    }
    spec_file.write_text(json.dumps(spec))
    result = podman.run(
        ContainerRequest(
            "probe",
            cdi_devices=(f"{kind}=gpu0",),
            env=(("POD_ENV", "from-pod"),),
            inspect_paths=("/usr/local/gpu-libs/marker",),
        )
    )
    assert result.ok, result.error
    assert result.executed is True and result.runtime == "podman"
    assert result.env["SANDBOX_GPU"] == "gpu0"
    assert result.env["SANDBOX_SPEC_LEVEL"] == "yes"
    assert result.env["POD_ENV"] == "from-pod"
    mount = next(m for m in result.mounts if m.target == "/usr/local/gpu-libs")
    assert "ro" in mount.options
    # The bind mount really carries the host directory's content.
    assert result.files["/usr/local/gpu-libs/marker"] == "from-the-host"
    node = next(d for d in result.device_nodes if d.path == "/dev/sandbox-gpu0")
    assert (node.kind, node.major, node.minor) == ("c", 1, 3)


def test_container_without_device_does_not_see_it(podman: PodmanRuntime) -> None:
    result = podman.run(ContainerRequest("plain"))
    assert result.ok, result.error
    assert "SANDBOX_GPU" not in result.env
    assert "/usr/local/gpu-libs" not in result.mount_targets()


def test_too_new_spec_gets_a_clear_error(podman: PodmanRuntime, kind: str, spec_file: Path) -> None:
    spec = {"cdiVersion": "0.6.0", "kind": kind, "annotations": {"a": "b"},
            "devices": [{"name": "gpu0", "containerEdits": {"env": ["A=1"]}}]}
    spec_file.write_text(json.dumps(spec))
    result = podman.run(ContainerRequest("probe", cdi_devices=(f"{kind}=gpu0",)))
    assert not result.ok and result.executed is False
    assert result.error is not None and "cdiVersion <= 0.5.0" in result.error
