"""The usage sampler's pod labels cost the API nothing on the passes that follow claim operations: it learns each
claim's pod from the claim the engine read to prepare it, GETs only claims it never saw, and asks again for a
claim reserved for no pod only on its timed passes (64 concurrent prepares used to bring up to 64 more GETs)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from dra_driver.inventory.catalog import MigOffering, catalog
from dra_driver.inventory.discover import discover
from dra_driver.k8s.client import JsonObject
from dra_driver.nvml.fake.backend import FakeNvml
from dra_driver.nvml.types import DeviceUtilisation
from dra_driver.observability.metrics import PluginMetrics
from dra_driver.plugin.checkpoint import Checkpoint, ClaimRecord, ClaimState, PreparedDevice
from dra_driver.plugin.utilisation import SamplerParts, UtilisationSampler
from tests.polling import wait_for


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
        SamplerParts(
            nvml=nvml,
            checkpoint=lambda: state["checkpoint"],
            catalog=lambda: devices,
            get_claim=claims.get,
            metrics=metrics,
        ),
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
    registry = sampler.parts.metrics.registry
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


class CountingNvml:
    """The fake NVML, counting the usage reads the sampler makes; `exact` answers a UUID with that sample only
    (the fake overlays what its state sets on its load model, so it cannot lose a value)."""

    def __init__(self, nvml: FakeNvml) -> None:
        self.nvml = nvml
        self.reads: list[str] = []
        self.exact: dict[str, DeviceUtilisation] = {}

    def device_usage(self, uuid: str, held: bool = False) -> Any:
        self.reads.append(uuid)
        return self.exact.get(uuid) or self.nvml.device_usage(uuid, held=held)


def _values(sampler: UtilisationSampler, name: str) -> dict[str, float]:
    return {
        s.labels["claim"]: s.value
        for family in sampler.parts.metrics.registry.collect()
        for s in family.samples
        if s.name == name
    }


def test_a_claim_woken_pass_reads_only_new_holders_and_the_timed_pass_reads_all() -> None:
    sampler, _, state, nvml = _setup()
    counting = CountingNvml(nvml)
    sampler.parts = replace(sampler.parts, nvml=counting)  # type: ignore[arg-type]
    gpus = nvml.gpus()
    state["checkpoint"] = _prepared(nvml, "a")
    sampler.sample_once(timed=False, new_only=True)
    assert counting.reads == [gpus[0].uuid]
    nvml.set_usage(gpus[0].uuid, DeviceUtilisation(gpu_utilization_percent=7))
    sampler.sample_once(timed=False, new_only=True)  # woken by an operation that changed no holder
    assert counting.reads == [gpus[0].uuid]
    state["checkpoint"] = _prepared(nvml, "a", "b")
    sampler.sample_once(timed=False, new_only=True)
    assert counting.reads == [gpus[0].uuid, gpus[1].uuid]  # only b's device
    util = _values(sampler, "dra_driver_gpu_utilization_ratio")
    assert set(util) == {"a", "b"} and util["a"] != 0.07  # a's series kept as it was
    sampler.sample_once(timed=True)
    assert sorted(counting.reads[2:]) == sorted([gpus[0].uuid, gpus[1].uuid])
    assert _values(sampler, "dra_driver_gpu_utilization_ratio")["a"] == 0.07
    state["checkpoint"] = _prepared(nvml, "a")
    sampler.sample_once(timed=False, new_only=True)  # b released: its series go, nothing is read
    assert len(counting.reads) == 4
    assert set(_values(sampler, "dra_driver_gpu_memory_used_bytes")) == {"a"}
    assert {s.labels["claim"] for s in _samples(sampler, "dra_driver_gpu_ecc_errors_total")} == {"a"}


def test_trigger_reads_every_holder_again_and_a_value_gone_takes_its_series() -> None:
    sampler, _, state, nvml = _setup()
    counting = CountingNvml(nvml)
    sampler.parts = replace(sampler.parts, nvml=counting)  # type: ignore[arg-type]
    gpu = nvml.gpus()[0].uuid
    state["checkpoint"] = _prepared(nvml, "a")
    sampler.start()  # its first pass is a timed one; the interval (an hour) brings no other
    try:
        wait_for(lambda: sampler.passes == 1, 10, "the first pass")
        assert "a" in _values(sampler, "dra_driver_gpu_power_watts")
        counting.exact[gpu] = DeviceUtilisation(memory_used_bytes=5)  # a device that reports memory only now
        sampler.claims_changed()  # no holder changed: nothing is read again
        wait_for(lambda: len(counting.reads) == 1 and not sampler._wake.is_set(), 10, "the skipped pass")
        sampler.trigger()
        wait_for(lambda: "a" not in _values(sampler, "dra_driver_gpu_power_watts"), 10, "the power series to go")
    finally:
        sampler.stop()
    assert _values(sampler, "dra_driver_gpu_memory_used_bytes") == {"a": 5.0}
    counting.exact[gpu] = DeviceUtilisation(memory_used_bytes=6, power_watts=50.0)
    sampler.sample_once(timed=True)
    assert _values(sampler, "dra_driver_gpu_power_watts") == {"a": 50.0}  # and back, through a new child


def _samples(sampler: UtilisationSampler, name: str) -> list[Any]:
    return [s for f in sampler.parts.metrics.registry.collect() for s in f.samples if s.name == name]
