"""Backend specs: `real`, `fake:<preset>`, `fake:<file.yaml>`, knobs, and the errors for bad ones."""

from __future__ import annotations

from pathlib import Path

import pytest

from dra_driver.nvml.backend import NvmlBackend
from dra_driver.nvml.factory import FAKE_KNOBS, open_backend, parse_fake_spec
from dra_driver.nvml.fake.backend import FakeNvml, FakeSettings
from dra_driver.nvml.types import MigMode, NvmlReturn, Placement


def test_parse_a_preset_with_every_knob() -> None:
    spec = parse_fake_spec(
        "dgx-a100, state=/run/fake/s.json ,seed=node-b,mig=off,auto_reset=yes,passthrough=0,profiles_mig_off=supported"
        ",clique=7,driver=absent,vgpu=on,vgpu_mdev=off,fabric_partitions=true"
    )
    assert (spec.preset, spec.path, spec.seed, spec.mig, spec.clique) == ("dgx-a100", None, "node-b", False, 7)
    assert spec.settings == FakeSettings(
        state_path=Path("/run/fake/s.json"),
        auto_reset=True,
        passthrough=False,
        profiles_when_mig_disabled="supported",
        driver_absent=True,
        vgpu=True,
        fabric_partitions=True,
    )
    knobs = {"state", "seed", "mig", "auto_reset", "passthrough", "profiles_mig_off", "clique", "driver", "vgpu",
             "vgpu_mdev", "fabric_partitions"}
    assert set(FAKE_KNOBS) == knobs


@pytest.mark.parametrize("target", ["node.yaml", "conf/node.yml", "/etc/dra/node"])
def test_parse_a_file_target(target: str) -> None:
    spec = parse_fake_spec(target)
    assert (spec.preset, spec.path, spec.settings) == (None, Path(target), FakeSettings())


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("fake:dgx-h900", "valid presets: a30x4, dgx-a100, dgx-h100, gb200-nvl72, hgx-h200, l4x2"),
        ("fake:", "needs a preset"),
        ("fake:dgx-h100,colour=red", "valid keys: state, seed, mig"),
        ("fake:dgx-h100,state", "key=value"),
        ("fake:dgx-h100,state=", "needs a file path"),
        ("fake:dgx-h100,mig=maybe", "mig='maybe'; use one of: true"),
        ("fake:dgx-h100,seed=a,seed=b", "given twice"),
        ("fake:dgx-h100,profiles_mig_off=sometimes", "auto, supported, not_supported"),
        ("fakes:dgx-h100", "use real, fake:<preset>"),
        ("", "unknown NVML backend"),
        ("fake:/nonexistent/node.yaml", "cannot read fake node file /nonexistent/node.yaml"),
        ("fake:dgx-h100,mig=off", None),
        ("fake:gb200-nvl72,clique=one", "clique='one'; give a clique id 0..4294967295"),
        ("fake:gb200-nvl72,clique=4294967296", "give a clique id"),
        ("fake:dgx-h100,clique=1", "has no GPU in a multi-node NVLink fabric"),
        ("fake:gb200-nvl72,clique=4294967295", None),
    ],
)
def test_bad_specs_are_value_errors_listing_the_choices(spec: str, needle: str | None) -> None:
    if needle is None:
        assert isinstance(open_backend(spec), FakeNvml)
        return
    with pytest.raises(ValueError) as err:
        open_backend(spec)
    assert needle in str(err.value)


def test_a_preset_backend_is_returned_uninitialised() -> None:
    backend = open_backend(" fake:l4x2 ")
    assert isinstance(backend, FakeNvml) and isinstance(backend, NvmlBackend)
    assert backend.calls() == []
    backend.init()
    assert [g.name for g in backend.gpus()] == ["NVIDIA L4"] * 2


def test_knobs_reach_the_backend(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    backend = open_backend(f"fake:dgx-h100,mig=on,seed=worker-3,state={state}")
    assert isinstance(backend, FakeNvml)
    backend.init()
    gpu = backend.gpus()[0].uuid
    assert backend.mig_mode(gpu) == MigMode(True, True)
    assert gpu not in {g.uuid for g in FakeNvml.preset("dgx-h100").node.gpus}  # seeded UUIDs
    backend.create_gpu_instance(gpu, 0, Placement(0, 8))
    assert state.exists()

    a30 = open_backend("fake:a30x4,passthrough=true")
    a30.init()
    assert a30.set_mig_mode(a30.gpus()[0].uuid, True) is NvmlReturn.RESET_REQUIRED
    a100 = open_backend("fake:dgx-a100,mig=off")
    a100.init()
    assert a100.mig_mode(a100.gpus()[0].uuid) == MigMode(False, False)


def test_a_node_file_backend(tmp_path: Path) -> None:
    node = tmp_path / "node.yaml"
    node.write_text("name: small\ngpus: [{model: A100-SXM4-80GB, count: 2, mig: enabled}]\n")
    backend = open_backend(f"fake:{node},auto_reset=true")
    backend.init()
    gpus = backend.gpus()
    assert [g.name for g in gpus] == ["NVIDIA A100-SXM4-80GB"] * 2
    assert {p.name for p in backend.gpu_instance_profiles(gpus[0].uuid)} >= {"1g.10gb", "7g.80gb"}
    bad = tmp_path / "bad.yaml"
    bad.write_text("gpus: [{model: H900}]\n")
    with pytest.raises(ValueError, match=r"^gpus\[0\]\.model: unknown model 'H900'.*\(in .*bad\.yaml\)$"):
        open_backend(f"fake:{bad}")


def test_real_is_imported_lazily_and_built_with_the_driver_root() -> None:
    backend = open_backend("real", driver_root="/run/nvidia/driver")
    assert type(backend).__name__ == "RealNvml"
    assert type(backend).__module__ == "dra_driver.nvml.real.backend"
    assert isinstance(backend, NvmlBackend)
