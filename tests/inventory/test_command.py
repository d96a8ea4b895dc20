"""`dra-driver inventory` as users run it: a real subprocess, real output."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dra_driver.nvml.fake.backend import FakeNvml, FakeSettings
from dra_driver.nvml.mps import MpsDaemonSpec, MpsShareLimits
from dra_driver.nvml.types import ComputeMode, NvmlUnavailableError, TimeSlice
from tests import kubeschema

PRESETS = ["dgx-h100", "dgx-a100", "hgx-h200", "a30x4", "l4x2"]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dra_driver.cli", "inventory", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("preset", PRESETS)
def test_json_for_every_preset(preset: str) -> None:
    out = _run("--nvml", f"fake:{preset}", "-o", "json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["system"]["driverVersion"] == "580.105.08"
    assert doc["gpus"], "no GPUs printed"
    first = doc["gpus"][0]
    assert first["info"]["uuid"].startswith("GPU-")
    assert first["info"]["pciBusId"].startswith("0000:")
    assert isinstance(first["migCapable"], bool)


def test_compute_mode_and_time_slice_come_from_the_state_file(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    fake = FakeNvml.preset("l4x2", settings=FakeSettings(state_path=state))
    fake.init()
    first, second = (g.uuid for g in fake.gpus())
    fake.set_compute_mode(first, ComputeMode.EXCLUSIVE_PROCESS)
    fake.set_time_slice(second, TimeSlice.LONG)
    fake.shutdown()
    out = _run("--nvml", f"fake:l4x2,state={state}", "-o", "json")
    assert out.returncode == 0, out.stderr
    gpus = {g["info"]["uuid"]: g for g in json.loads(out.stdout)["gpus"]}
    assert (gpus[first]["computeMode"], gpus[first]["timeSlice"]) == ("ExclusiveProcess", "Default")
    assert (gpus[second]["computeMode"], gpus[second]["timeSlice"]) == ("Default", "Long")


def test_mps_daemons_and_their_shares_come_from_the_state_file(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    fake = FakeNvml.preset("l4x2", settings=FakeSettings(state_path=state))
    fake.init()
    first, second = (g.uuid for g in fake.gpus())
    pipe_parent = tmp_path / "mps" / "gpu-x"
    (pipe_parent / "pipe").mkdir(parents=True)
    fake.mps_control().start(
        MpsDaemonSpec(
            id="gpu-x",
            directory=str(pipe_parent),
            visible_uuids=(first,),
            active_thread_percentage=30,
            pinned_memory_limits={first: 8 << 30},
            shares=(MpsShareLimits("share-1", "ns/a", 30, 8 << 30), MpsShareLimits("share-2", "ns/b", 10, 4 << 30)),
        )
    )
    fake.shutdown()
    out = _run("--nvml", f"fake:l4x2,state={state}", "-o", "json")
    assert out.returncode == 0, out.stderr
    gpus = {g["info"]["uuid"]: g for g in json.loads(out.stdout)["gpus"]}
    assert gpus[second]["mps"] is None
    mps = gpus[first]["mps"]
    assert mps["pipeDirectory"] == str(pipe_parent / "pipe")
    assert (mps["activeThreadPercentage"], mps["pinnedMemoryLimit"]) == (30, 8 << 30)
    assert [(s["claim"], s["activeThreadPercentage"], s["pinnedMemoryLimit"]) for s in mps["shares"]] == [
        ("ns/a", 30, 8 << 30),
        ("ns/b", 10, 4 << 30),
    ]


def test_a_time_slice_the_gpu_cannot_report_is_null(tmp_path: Path) -> None:
    node = tmp_path / "node.yaml"
    node.write_text("gpus:\n  - model: L4\n    time_slice: unsupported\n")
    out = _run("--nvml", f"fake:{node}", "-o", "json")
    assert out.returncode == 0, out.stderr
    [gpu] = json.loads(out.stdout)["gpus"]
    assert gpu["timeSlice"] is None and gpu["computeMode"] == "Default"


def test_yaml_is_default_and_lists_profiles() -> None:
    out = _run("--nvml", "fake:dgx-h100")
    assert out.returncode == 0, out.stderr
    doc = yaml.safe_load(out.stdout)
    names = [p["name"] for p in doc["gpus"][0]["migProfiles"]]
    assert "1g.10gb" in names and "7g.80gb" in names
    assert doc["gpus"][0]["info"]["architecture"] == "HOPPER"


def test_env_var_selects_the_backend() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "dra_driver.cli", "inventory", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"DRA_DRIVER_NVML": "fake:l4x2", "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr
    assert len(json.loads(out.stdout)["gpus"]) == 2


def test_unknown_preset_is_a_usage_error() -> None:
    out = _run("--nvml", "fake:dgx-h900")
    assert out.returncode == 2
    assert "dgx-h100" in out.stderr  # lists the valid presets


def test_real_nvml_without_a_gpu_fails_with_one_clear_line() -> None:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        pass
    else:  # pragma: no cover - only on a GPU machine
        pynvml.nvmlShutdown()
        pytest.skip("a real GPU is present")
    out = _run("--nvml", "real")
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "libnvidia-ml" in lines[0]
    assert out.stdout == ""
    assert issubclass(NvmlUnavailableError, RuntimeError)


def test_slices_output_is_what_a_real_api_server_accepts() -> None:
    out = _run(
        "--nvml", "fake:dgx-h100", "--slices", "--mig-mode", "dynamic", "--node-name", "gpu-node-7", "-o", "json"
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["kind"] == "List" and len(doc["items"]) == 5
    for item in doc["items"]:
        kubeschema.validate(item, "1.35.0")
        assert item["spec"]["nodeName"] == "gpu-node-7" and item["spec"]["pool"]["name"] == "gpu-node-7"
    yaml_out = _run("--nvml", "fake:l4x2", "--slices", "--node-name", "n", "--kube-version", "1.34")
    docs = list(yaml.safe_load_all(yaml_out.stdout))
    assert [d["kind"] for d in docs] == ["ResourceSlice"]  # one document per object, ready for kubectl apply -f
    assert [d["name"] for d in docs[0]["spec"]["devices"]] == ["gpu-0", "gpu-1"]


def test_shares_show_in_the_inventory_and_the_slices() -> None:
    plain = json.loads(_run("--nvml", "fake:l4x2", "-o", "json").stdout)
    assert all("sharedDevice" not in gpu for gpu in plain["gpus"])  # exclusive: unchanged output
    shared = _run("--nvml", "fake:l4x2", "--sharing-mode", "shares", "--shared-gpus", "1", "-o", "json")
    assert shared.returncode == 0, shared.stderr
    assert [gpu["sharedDevice"] for gpu in json.loads(shared.stdout)["gpus"]] == [None, "gpu-1-shared"]
    human = yaml.safe_load(_run("--nvml", "fake:l4x2", "--sharing-mode", "shares").stdout)
    assert [gpu["sharedDevice"] for gpu in human["gpus"]] == ["gpu-0-shared", "gpu-1-shared"]
    slices = _run("--nvml", "fake:l4x2", "--slices", "--node-name", "n", "--sharing-mode", "shares", "-o", "json")
    devices = [d["name"] for s in json.loads(slices.stdout)["items"] for d in s["spec"].get("devices", [])]
    assert devices == ["gpu-0", "gpu-0-shared", "gpu-1", "gpu-1-shared"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--shared-gpus", "5"), "--shared-gpus names 5, which is no GPU of this node; use indexes or UUIDs of: 0 ("),
        (("--share-memory-default", "4500Mi"), "--share-memory-default 4500Mi must be a multiple of --share-memory-step"),
        (("--share-compute-default", "150"), "--share-compute-default 150 must be a whole percent from 1 to 100"),
    ],
)
def test_bad_sharing_flags_are_usage_errors_naming_the_flag(args: tuple[str, ...], message: str) -> None:
    out = _run("--nvml", "fake:l4x2", "--sharing-mode", "shares", *args)
    assert out.returncode == 2
    assert message in out.stderr
    assert "Traceback" not in out.stderr
