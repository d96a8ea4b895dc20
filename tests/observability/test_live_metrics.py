"""The plugin's /metrics on its own port, scraped over HTTP: every series there from the start, and usage series
that follow the claims holding devices (they appear while a claim is prepared and vanish after unprepare)."""

from __future__ import annotations

from dra_driver import __version__
from dra_driver.nvml.types import DeviceUtilisation
from tests.observability.conftest import LivePlugin
from tests.observability.scrape import Sample, find, names, scrape
from tests.polling import wait_for

AT_START = {
    "dra_driver_build_info",
    "process_start_time_seconds",
    "process_resident_memory_bytes",
    "python_info",
    "python_gc_collections_total",
    "dra_driver_claim_operations_total",
    "dra_driver_claim_operation_seconds_bucket",
    "dra_driver_prepared_claims",
    "dra_driver_prepared_devices",
    "dra_driver_published_devices",
    "dra_driver_devices",
    "dra_driver_slice_publish_operations_total",
    "dra_driver_published_slices",
    "dra_driver_mig_operation_seconds_bucket",
    "dra_driver_mig_operation_failures_total",
    "dra_driver_mps_daemons_running",
    "dra_driver_checkpoint_write_seconds_bucket",
    "dra_driver_usage_samples_total",
}


def test_every_series_is_there_from_the_start_at_zero(live: LivePlugin) -> None:
    samples = scrape(live.port)
    assert names(samples) >= AT_START, AT_START - names(samples)
    (build,) = find(samples, "dra_driver_build_info")
    assert build.labels["version"] == __version__ and build.labels["python"] and build.value == 1
    for operation in ("prepare", "unprepare"):
        for outcome in ("success", "error"):
            (counter,) = find(samples, "dra_driver_claim_operations_total", operation=operation, outcome=outcome)
            assert counter.value == 0
    assert {s.labels["type"] for s in find(samples, "dra_driver_prepared_devices")} == {"gpu", "mig", "share"}
    assert {s.labels["operation"] for s in find(samples, "dra_driver_mig_operation_failures_total")} == {
        "create",
        "destroy",
    }
    (healthy,) = find(samples, "dra_driver_devices", health="healthy")
    assert healthy.value > 8  # 8 GPUs and their MIG partitions
    assert find(samples, "dra_driver_devices", health="unhealthy")[0].value == 0
    # The first publishing pass lands in the metrics.
    wait_for(lambda: find(scrape(live.port), "dra_driver_published_slices")[0].value >= 1, 10, "slices published")
    ok = find(scrape(live.port), "dra_driver_slice_publish_operations_total", outcome="success")[0]
    assert ok.value >= 1


def test_usage_series_follow_the_claim_holding_the_device(live: LivePlugin) -> None:
    mig_name = next(n for n in sorted(live.plugin.devices()) if n.startswith("gpu-1-mig-1g"))
    gpu = live.claim("ml", "train", ["gpu-0"], pod="trainer-0")
    mig = live.claim("ml", "notebook", [mig_name])
    result = live.plugin.engine.prepare([gpu, mig])
    assert [r.error for r in result.values()] == ["", ""]

    def usage() -> list[Sample]:
        samples = scrape(live.port)
        return find(samples, "dra_driver_gpu_memory_used_bytes", namespace="ml")

    wait_for(lambda: len(usage()) == 2, 10, "usage series of both claims")
    series = scrape(live.port)
    (util,) = find(series, "dra_driver_gpu_utilization_ratio", namespace="ml")
    gpu0 = live.nvml.gpus()[0].uuid
    assert util.labels == {
        "namespace": "ml",
        "claim": "train",
        "pod": "trainer-0",
        "device": "gpu-0",
        "gpu_uuid": gpu0,
        "profile": "gpu",
        "share": "",
    }
    assert 0.4 <= util.value < 0.9  # the fake's load model: a held GPU is busy
    assert find(series, "dra_driver_gpu_power_watts", claim="train")[0].value > 70
    assert {s.labels["type"] for s in find(series, "dra_driver_gpu_ecc_errors_total", claim="train")} == {
        "corrected",
        "uncorrected",
    }
    assert find(series, "dra_driver_gpu_throttled", claim="train")[0].value == 0
    # A MIG device reports memory only: no utilization, power or temperature series, not zeros.
    (mig_memory,) = find(series, "dra_driver_gpu_memory_used_bytes", claim="notebook")
    assert mig_memory.labels["gpu_uuid"].startswith("MIG-") and mig_memory.labels["profile"] == "1g.10gb"
    assert mig_memory.labels["pod"] == ""  # reserved for nobody
    for name in (
        "dra_driver_gpu_utilization_ratio",
        "dra_driver_gpu_power_watts",
        "dra_driver_gpu_temperature_celsius",
    ):
        assert find(series, name, claim="notebook") == []
    assert find(series, "dra_driver_prepared_devices", type="gpu")[0].value == 1
    assert find(series, "dra_driver_prepared_devices", type="mig")[0].value == 1
    assert find(series, "dra_driver_mig_operation_seconds_count", operation="create")[0].value == 1

    # Explicit usage from the state (what a test or a demo sets) wins over the load model.
    live.nvml.set_usage(gpu0, DeviceUtilisation(gpu_utilization_percent=3, throttle_reasons=0x4))
    live.plugin.usage_sampler.trigger()  # type: ignore[union-attr]
    wait_for(
        lambda: find(scrape(live.port), "dra_driver_gpu_utilization_ratio", claim="train")[0].value == 0.03,
        10,
        "the explicit utilization",
    )
    assert find(scrape(live.port), "dra_driver_gpu_throttled", claim="train")[0].value == 1

    assert live.plugin.engine.unprepare([gpu]) == {gpu.uid: ""}
    wait_for(lambda: [s.labels["claim"] for s in usage()] == ["notebook"], 10, "the released GPU's series to vanish")
    after = scrape(live.port)
    assert find(after, "dra_driver_gpu_ecc_errors_total", claim="train") == []
    assert find(after, "dra_driver_claim_operations_total", operation="unprepare", outcome="success")[0].value == 1
    assert live.plugin.engine.unprepare([mig]) == {mig.uid: ""}
    wait_for(lambda: usage() == [], 10, "every usage series to vanish")
    final = scrape(live.port)
    assert find(final, "dra_driver_mig_operation_seconds_count", operation="destroy")[0].value >= 1
    assert find(final, "dra_driver_checkpoint_write_seconds_count")[0].value >= 4
