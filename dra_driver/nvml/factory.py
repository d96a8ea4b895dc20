"""Backend specs -> NvmlBackend: `real`, `fake:<preset>`, `fake:<node.yaml>`, with `,key=value` knobs.

    real
    fake:dgx-h100
    fake:dgx-h100,state=/var/lib/fake/state.json,mig=on
    fake:/etc/fake/node.yaml,seed=node-b,auto_reset=true

The backend comes back uninitialised: callers call init() (and shutdown()) as with real NVML.
Bad specs raise ValueError naming what is wrong and listing the valid choices.

The fake backend is imported only for a `fake:` spec: its node files and state are pydantic models parsed from
YAML, which the real backend (the product on a GPU node) never needs at start-up.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, get_args

from dra_driver.nvml.backend import NvmlBackend
from dra_driver.nvml.fabricmanager import FabricManagerAddress
from dra_driver.nvml.mps import MpsControl

if TYPE_CHECKING:
    from dra_driver.nvml.fake.backend import FakeSettings

FAKE_BACKEND_MODULE = "dra_driver.nvml.fake.backend"

# knob -> what it takes (shown in errors and docs/fake-nvml.md)
FAKE_KNOBS: dict[str, str] = {
    "state": "path of the JSON state file (MIG state survives restarts; shared between processes)",
    "seed": "string mixed into generated GPU UUIDs (give each fake node of a cluster its own)",
    "mig": "on|off: initial MIG mode of every MIG-capable GPU (overrides the node file)",
    "auto_reset": "true|false: Ampere MIG-mode changes activate at once when the GPU is idle",
    "passthrough": "true|false: Ampere MIG-mode changes report RESET_REQUIRED (VM passthrough)",
    "profiles_mig_off": "auto|supported|not_supported: GI profile queries while MIG is disabled",
    "driver": "loaded|absent: absent = the node starts with no NVIDIA kernel driver (init fails until it is loaded)",
    "vgpu": "true|false: the NVIDIA vGPU Manager is installed: Ampere+ GPUs have vGPU types and SR-IOV VFs",
    "vgpu_mdev": "true|false: with vgpu=true, the GPUs are mediated-device parents (mdev) instead of SR-IOV GPUs",
    "fabric_partitions": "true|false: Fabric Manager runs in shared NVSwitch mode (its predefined GPU partitions)",
    "clique": "N: the clique id of every GPU in a multi-node NVLink fabric (which rack of a GB200 NVL72 cluster)",
}
_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


@dataclass(frozen=True)
class FakeSpec:
    """A parsed `fake:...` spec."""

    preset: str | None  # exactly one of preset / path is set
    path: Path | None
    settings: FakeSettings
    seed: str | None = None
    mig: bool | None = None
    clique: int | None = None


def open_backend(
    spec: str, *, driver_root: str | None = None, fabric_manager: FabricManagerAddress | None = None
) -> NvmlBackend:
    """Build the backend a `--nvml` value names (not yet initialised). `fabric_manager`: where a real node's Fabric
    Manager is asked (None: it is not; the fake answers as its knob `fabric_partitions` says)."""
    text = spec.strip()
    if text == "real":
        # Imported lazily: the real backend pulls in pynvml, which fake-only tools never need.
        from dra_driver.nvml.real.backend import RealNvml

        return RealNvml(driver_root=driver_root, fabric_manager=fabric_manager)
    if text.startswith("fake:"):
        from dra_driver.nvml.fake.backend import FakeNvml

        fake = parse_fake_spec(text.removeprefix("fake:"))
        if fake.preset is not None:
            return FakeNvml.preset(
                fake.preset, seed=fake.seed, mig=fake.mig, clique=fake.clique, settings=fake.settings
            )
        assert fake.path is not None
        return FakeNvml.from_file(fake.path, seed=fake.seed, mig=fake.mig, clique=fake.clique, settings=fake.settings)
    from dra_driver.nvml.fake.nodefile import preset_names

    raise ValueError(
        f"unknown NVML backend {spec!r}; use real, fake:<preset>[,key=value...] or fake:<node.yaml>; "
        f"presets: {', '.join(preset_names())}"
    )


def parse_fake_spec(body: str) -> FakeSpec:
    """Parse what follows `fake:`: a preset name or a YAML path, then `,key=value` knobs."""
    from dra_driver.nvml.fake.backend import FakeSettings, ProfileQueryMode
    from dra_driver.nvml.fake.nodefile import preset_names

    policies: dict[str, ProfileQueryMode] = {p: p for p in get_args(ProfileQueryMode)}
    target, *knob_texts = (part.strip() for part in body.split(","))
    if not target:
        raise ValueError(
            f"fake: needs a preset or a node file, e.g. fake:dgx-h100; presets: {', '.join(preset_names())}"
        )
    preset: str | None = None
    path: Path | None = None
    if target.endswith((".yaml", ".yml")) or "/" in target:
        path = Path(target)
    elif target in preset_names():
        preset = target
    else:
        raise ValueError(
            f"unknown fake NVML preset {target!r}; valid presets: {', '.join(preset_names())} "
            "(or give a node file ending in .yaml)"
        )
    knobs: dict[str, str] = {}
    for item in knob_texts:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"fake NVML option {item!r} must look like key=value; valid keys: {', '.join(FAKE_KNOBS)}")
        if key not in FAKE_KNOBS:
            raise ValueError(f"unknown fake NVML option {key!r}; valid keys: {', '.join(FAKE_KNOBS)}")
        if key in knobs:
            raise ValueError(f"fake NVML option {key!r} is given twice")
        knobs[key] = value.strip()
    state = knobs.get("state")
    if state is not None and not state:
        raise ValueError("fake NVML option state= needs a file path, e.g. state=/var/lib/dra/fake-state.json")
    policy_text = knobs.get("profiles_mig_off", "auto")
    policy = policies.get(policy_text)
    if policy is None:
        raise ValueError(f"fake NVML option profiles_mig_off={policy_text!r}; choose one of: {', '.join(policies)}")
    driver_text = knobs.get("driver", "loaded")
    if driver_text not in ("loaded", "absent"):
        raise ValueError(f"fake NVML option driver={driver_text!r}; choose one of: loaded, absent")
    settings = FakeSettings(
        state_path=Path(state) if state else None,
        driver_absent=driver_text == "absent",
        auto_reset=_flag(knobs, "auto_reset"),
        passthrough=_flag(knobs, "passthrough"),
        vgpu=_flag(knobs, "vgpu"),
        vgpu_mdev=_flag(knobs, "vgpu_mdev"),
        fabric_partitions=_flag(knobs, "fabric_partitions"),
        profiles_when_mig_disabled=policy,
    )
    mig = None if "mig" not in knobs else _flag(knobs, "mig")
    seed = knobs.get("seed") or None
    clique_text = knobs.get("clique")
    if clique_text is not None and not (clique_text.isdigit() and int(clique_text) <= 0xFFFFFFFF):
        raise ValueError(f"fake NVML option clique={clique_text!r}; give a clique id 0..4294967295, e.g. clique=1")
    clique = int(clique_text) if clique_text is not None else None
    return FakeSpec(preset=preset, path=path, settings=settings, seed=seed, mig=mig, clique=clique)


def _flag(knobs: dict[str, str], key: str) -> bool:
    value = knobs.get(key, "false").lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"fake NVML option {key}={knobs[key]!r}; use one of: {', '.join(_TRUE + _FALSE)}")


def open_mps_control(
    backend: NvmlBackend, *, driver_root: str | None = None, cgroup_root: str | None = None
) -> MpsControl | None:
    """The MPS control daemons of the node the backend drives: the fake keeps them in its state (file); real GPUs
    run the host driver's nvidia-cuda-mps-control (`cgroup_root`: see HostMpsControl)."""
    # A FakeNvml exists only if its module was imported: looking in sys.modules keeps the real path from
    # importing the fake just to find out that the backend is not one.
    fake = sys.modules.get(FAKE_BACKEND_MODULE)
    if fake is not None and isinstance(backend, fake.FakeNvml):
        mps: MpsControl = backend.mps_control()
        return mps
    from dra_driver.nvml.real.mps import HostMpsControl

    return HostMpsControl(driver_root, cgroup_root=cgroup_root)
