"""Property: whatever mix of MIG and whole-GPU claims the allocator grants from our dynamic-MIG slices, the
granted placements are a layout real MIG hardware accepts (replayed on the fake NVML, which enforces the
MIG rules), and a whole GPU never coexists with a partition of it."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dra_driver.allocation import allocate
from dra_driver.cel.environment import DraCelEnvironment
from dra_driver.defaults import DRIVER_NAME
from dra_driver.inventory.catalog import MigOffering, catalog
from dra_driver.inventory.discover import discover
from dra_driver.nvml.factory import open_backend
from dra_driver.nvml.types import NvmlError
from dra_driver.slices.builder import SliceSettings, build_slices
from dra_driver.slices.counters import counter_totals
from tests.narrow import present

DRIVER = DRIVER_NAME
NODE = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a", "labels": {}}}
PROFILES = {"1g": "1g.10gb", "1g20": "1g.20gb", "2g": "2g.20gb", "3g": "3g.40gb", "4g": "4g.40gb", "7g": "7g.80gb"}
CEL = DraCelEnvironment()


def _classes() -> list[dict[str, Any]]:
    def cls(name: str, expr: str) -> dict[str, Any]:
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": expr}}]},
        }

    out = [cls("gpu", f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == 'gpu'")]
    for key, profile in PROFILES.items():
        # `type == 'mig'` first: a whole GPU has no `profile`, and a missing attribute is an evaluation error.
        out.append(
            cls(
                key,
                f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == 'mig' && "
                f"device.attributes['{DRIVER}'].profile == '{profile}'",
            )
        )
    return out


CLASSES = _classes()


def _setup(gpus: int) -> tuple[Any, list[dict[str, Any]], Any]:
    backend = open_backend("fake:dgx-h100")
    backend.init()
    inv = discover(backend)
    keep = {g.uuid for g in inv.gpus[:gpus]}
    devices = {k: v for k, v in catalog(inv, MigOffering.DYNAMIC).items() if v.gpu.uuid in keep}
    slices = build_slices(inv.system, devices, SliceSettings(DRIVER, "node-a"), generation=1)
    return inv, slices, devices


INV, SLICES, DEVICES = _setup(gpus=2)


def _claim(i: int, cls: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": f"c{i}", "namespace": "default", "uid": f"uid-{i}"},
        "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": cls}}]}},
    }


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(["gpu", *PROFILES]), min_size=1, max_size=14), st.randoms(use_true_random=False))
def test_granted_placements_are_a_valid_mig_layout(wanted: list[str], rnd: Any) -> None:
    granted: list[dict[str, Any]] = []
    for i, cls in enumerate(wanted):
        claim = _claim(i, cls)
        outcome = allocate(claim, node=NODE, classes=CLASSES, slices=SLICES, allocated_claims=granted, cel=CEL)
        if outcome.ok:
            granted.append({**claim, "status": {"allocation": outcome.allocation}})
        if granted and rnd.random() < 0.2:
            granted.pop(rnd.randrange(len(granted)))  # a claim is deleted: its devices free up

    chosen = [DEVICES[r["device"]] for c in granted for r in c["status"]["allocation"]["devices"]["results"]]
    # Replay on hardware semantics: every granted partition must be creatable, all together.
    backend = open_backend("fake:dgx-h100")
    backend.init()
    whole = {d.gpu.uuid for d in chosen if d.profile is None}
    for dev in chosen:
        if dev.profile is None:
            continue
        assert dev.gpu.uuid not in whole, f"{dev.name} granted next to its whole GPU"
        mode = backend.mig_mode(dev.gpu.uuid)
        if mode is not None and not mode.current:
            backend.set_mig_mode(dev.gpu.uuid, True)
        assert dev.placement is not None
        try:
            backend.create_gpu_instance(dev.gpu.uuid, dev.profile.id, dev.placement)
        except NvmlError as exc:  # pragma: no cover - the property failing
            raise AssertionError(f"allocator granted {[d.name for d in chosen]} but {dev.name} fails: {exc}") from exc
    assert len({d.name for d in chosen}) == len(chosen)


def _grant(wanted: list[str]) -> list[str | None]:
    granted: list[dict[str, Any]] = []
    out: list[str | None] = []
    for i, cls in enumerate(wanted):
        claim = _claim(i, cls)
        outcome = allocate(claim, node=NODE, classes=CLASSES, slices=SLICES, allocated_claims=granted, cel=CEL)
        if outcome.ok:
            granted.append({**claim, "status": {"allocation": outcome.allocation}})
            out.append(present(outcome.allocation)["devices"]["results"][0]["device"])
        else:
            out.append(None)
    return out


def test_partitions_fill_from_the_top_and_exclude_the_whole_gpu() -> None:
    got = _grant(["1g", "2g", "3g", "4g", "1g", "gpu", "7g", "gpu", "1g"])
    assert got[:4] == [
        "gpu-0-mig-1g10gb-19-6",
        "gpu-0-mig-2g20gb-14-4",
        "gpu-0-mig-3g40gb-9-0",  # 4:4 overlaps the 2g at 4:2, so 0:4
        "gpu-1-mig-4g40gb-5-0",  # GPU 0 has no 0:4 left
    ]
    assert got[4] == "gpu-1-mig-1g10gb-19-6"  # GPU 0 slices 0-6 are taken; 7 is no 1g placement
    assert got[5] is None and got[6] is None  # both GPUs hold partitions: no whole GPU, no 7g
    assert got[7] is None and got[8] is not None


def test_counters_cover_every_single_profile_layout() -> None:
    """Sanity of the counter totals: seven 1g, or 4g+3g, fit; the whole GPU uses every counter."""
    gpu = INV.gpus[0]
    totals = counter_totals(gpu)
    one_g = next(p for p in gpu.mig_profiles if p.name == "1g.10gb")
    assert 7 * one_g.multiprocessors <= totals["multiprocessors"]
    four, three = (next(p for p in gpu.mig_profiles if p.name == n) for n in ("4g.40gb", "3g.40gb"))
    assert four.memory_bytes + three.memory_bytes <= totals["memory"]
