"""The usage sampler's pod labels cost the API nothing on the passes that follow claim operations: it learns each
claim's pod from the claim the engine read to prepare it, GETs only claims it never saw, and asks again for a
claim reserved for no pod only on its timed passes (64 concurrent prepares used to bring up to 64 more GETs)."""

from __future__ import annotations

from typing import Any

from dra_driver.inventory.catalog import MigOffering, catalog
from dra_driver.inventory.discover import discover
from dra_driver.k8s.client import JsonObject
from dra_driver.nvml.fake.backend import FakeNvml
from dra_driver.observability.metrics import PluginMetrics
from dra_driver.plugin.checkpoint import Checkpoint, ClaimRecord, ClaimState, PreparedDevice
from dra_driver.plugin.utilisation import UtilisationSampler


class Claims:
    def __init__(self) -> None:
        self.pods: dict[str, str] = {}
        self.gets: list[str] = []

    def get(self, namespace: str, name: str) -> JsonObject | None:
        self.gets.append(name)
        pod = self.pods.get(name)
        return {"status": {"reservedFor": [{"resource": "pods", "name": pod}] if pod else []}}


def _claim_object(pod: str) -> JsonObject:
    return {"metadata": {"uid": "x"}, "status": {"reservedFor": [{"resource": "pods", "name": pod, "uid": "p"}]}}


def _setup() -> tuple[UtilisationSampler, Claims, dict[str, Any], FakeNvml]:
    nvml = FakeNvml.preset("l4x2")
    nvml.init()
    devices = catalog(discover(nvml), MigOffering.STATIC)
    state: dict[str, Any] = {"checkpoint": Checkpoint()}
    claims = Claims()
    metrics = PluginMetrics(process_collectors=False)
    sampler = UtilisationSampler(
        nvml,
        checkpoint=lambda: state["checkpoint"],
        catalog=lambda: devices,
        get_claim=claims.get,
        metrics=metrics,
        interval=3600.0,
    )
    return sampler, claims, state, nvml


def _prepared(nvml: FakeNvml, *names: str) -> Checkpoint:
    gpus = nvml.gpus()
    records = {
        f"uid-{name}": ClaimRecord(
            f"uid-{name}",
            "ns",
            name,
            ClaimState.PREPARE_COMPLETED,
            devices=(PreparedDevice(("r",), "node", f"gpu-{i}", gpu_uuid=gpus[i].uuid),),
        )
        for i, name in enumerate(names)
    }
    return Checkpoint("b", records)


def _pod_labels(sampler: UtilisationSampler) -> dict[str, str]:
    registry = sampler._metrics.registry
    found = {}
    for family in registry.collect():
        if family.name == "dra_driver_gpu_memory_used_bytes":
            for sample in family.samples:
                found[sample.labels["claim"]] = sample.labels["pod"]
    return found


def test_a_claim_the_engine_read_costs_no_get() -> None:
    sampler, claims, state, nvml = _setup()
    sampler.note_claim("uid-a", _claim_object("pod-a"))  # as the engine's prepare does after its GET
    state["checkpoint"] = _prepared(nvml, "a")
    sampler.sample_once(timed=False)  # the pass the prepare wakes
    assert claims.gets == []
    assert _pod_labels(sampler) == {"a": "pod-a"}


def test_an_unseen_claim_is_read_once_and_a_podless_one_again_only_on_timed_passes() -> None:
    sampler, claims, state, nvml = _setup()
    claims.pods["b"] = "pod-b"
    state["checkpoint"] = _prepared(nvml, "b", "c")  # c: reserved for no pod (yet)
    sampler.sample_once(timed=False)
    assert sorted(claims.gets) == ["b", "c"]
    sampler.sample_once(timed=False)
    sampler.sample_once(timed=False)
    assert sorted(claims.gets) == ["b", "c"]  # passes woken by claim operations ask nothing again
    assert _pod_labels(sampler) == {"b": "pod-b", "c": ""}
    claims.pods["c"] = "pod-c"
    sampler.sample_once(timed=True)
    assert sorted(claims.gets) == ["b", "c", "c"]  # only the podless claim, on the interval's pass
    assert _pod_labels(sampler) == {"b": "pod-b", "c": "pod-c"}


def test_a_claim_noted_before_its_record_completes_survives_untimed_passes() -> None:
    sampler, claims, state, nvml = _setup()
    sampler.note_claim("uid-d", _claim_object("pod-d"))
    sampler.sample_once(timed=False)  # another claim's operation woke it while d was still being prepared
    state["checkpoint"] = _prepared(nvml, "d")
    sampler.sample_once(timed=False)
    assert claims.gets == []
    assert _pod_labels(sampler) == {"d": "pod-d"}
