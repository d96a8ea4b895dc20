"""The prepared-claim gauges kept by deltas (plugin/preparedmetrics.py) equal a recount of the checkpoint recorded,
whatever sequence of checkpoints the engine's writes hand them (claims coming, going, changing state and devices,
MPS daemons shared between claims, a checkpoint recorded twice or an older one recorded after a newer one)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from dra_driver.kubeletplugin import claimrecord
from dra_driver.observability.metrics import PREPARED_TYPES, PluginMetrics
from dra_driver.plugin.checkpoint import Checkpoint, ClaimRecord, ClaimState, MpsRecord, PreparedDevice
from dra_driver.plugin.preparedmetrics import PreparedMetrics, recount

UIDS = ("a", "b", "c", "d")
DEVICES = (
    PreparedDevice(("r",), "p", "gpu-0"),
    PreparedDevice(("r",), "p", "gpu-1-mig-1g.10gb-0"),
    PreparedDevice(("r",), "p", "gpu-2", share_id="s-1"),
    PreparedDevice(("r",), "p", "gpu-3", mps=MpsRecord(daemon="mps-3")),
    PreparedDevice(("r",), "p", "gpu-4", mps=MpsRecord(daemon="mps-3", share=True)),
    PreparedDevice(("r",), "p", "gpu-5", mps=MpsRecord(daemon="mps-5")),
)

records: st.SearchStrategy[ClaimRecord] = st.builds(
    lambda uid, state, devices: claimrecord.ClaimRecord(uid, "ns", uid, state, devices=tuple(devices)),
    st.sampled_from(UIDS),
    st.sampled_from(list(ClaimState)),
    st.lists(st.sampled_from(DEVICES), max_size=3),
)


def shown(metrics: PluginMetrics) -> tuple[int, dict[str, int], int]:
    def value(name: str, labels: dict[str, str] | None = None) -> int:
        sample = metrics.registry.get_sample_value(name, labels or {})
        return int(sample or 0)

    devices = {t: value("dra_driver_prepared_devices", {"type": t}) for t in PREPARED_TYPES}
    return value("dra_driver_prepared_claims"), devices, value("dra_driver_mps_daemons_running")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(records, st.sampled_from(UIDS), st.integers(0, 9)), min_size=1, max_size=30))
def test_the_gauges_kept_by_deltas_equal_a_recount_of_the_checkpoint_recorded(steps: list[object]) -> None:
    """Each step writes a record (a claim added or changed), drops a claim (a uid), or records again one of the
    checkpoints written so far (an int: concurrent claims finishing on the same or an older checkpoint)."""
    metrics = PluginMetrics()
    prepared = PreparedMetrics(metrics)
    written: list[Checkpoint] = [claimrecord.Checkpoint("boot")]
    for step in steps:
        if isinstance(step, int):
            checkpoint = written[step % len(written)]
        elif isinstance(step, str):
            checkpoint = written[-1].without_claim(step)
        else:
            assert isinstance(step, claimrecord.ClaimRecord)
            checkpoint = written[-1].with_claim(step)
        written.append(checkpoint)
        prepared.record(checkpoint)
        assert shown(metrics) == recount(checkpoint)


def test_an_unchanged_record_is_not_counted_again_and_a_change_of_state_is() -> None:
    metrics = PluginMetrics()
    prepared = PreparedMetrics(metrics)
    started: ClaimRecord = claimrecord.ClaimRecord("a", "ns", "a", ClaimState.PREPARE_STARTED, allocated=DEVICES[3:4])
    done: ClaimRecord = claimrecord.ClaimRecord("a", "ns", "a", ClaimState.PREPARE_COMPLETED, devices=DEVICES[3:5])
    other: ClaimRecord = claimrecord.ClaimRecord("b", "ns", "b", ClaimState.PREPARE_COMPLETED, devices=DEVICES[:1])
    empty: Checkpoint = claimrecord.Checkpoint("boot")
    cp = empty.with_claim(started)
    prepared.record(cp)
    assert shown(metrics) == (0, {"gpu": 0, "mig": 0, "share": 0}, 0)
    cp = cp.with_claim(done)
    prepared.record(cp)
    cp = cp.with_claim(other)
    prepared.record(cp)
    prepared.record(cp)
    assert shown(metrics) == (2, {"gpu": 2, "mig": 0, "share": 1}, 1)
    cp = cp.without_claim("a")
    prepared.record(cp)
    assert shown(metrics) == (1, {"gpu": 1, "mig": 0, "share": 0}, 0)


def test_a_checkpoint_made_from_the_one_recorded_last_is_counted_by_its_one_changed_record() -> None:
    """With 64 claims held every write compared all of them: a checkpoint made by `with_claim`/`without_claim` from
    the claims recorded last costs one record's count; any other goes through the comparison."""
    metrics = PluginMetrics()
    prepared = PreparedMetrics(metrics)
    compared: list[int] = []
    each = prepared._each_changed

    def counting(before: object, after: object) -> None:
        compared.append(1)
        each(before, after)  # type: ignore[arg-type]

    prepared._each_changed = counting  # type: ignore[method-assign]
    cp: Checkpoint = claimrecord.Checkpoint("boot")
    prepared.record(cp)  # the first (the one loaded at start) by comparison
    compared.clear()
    for uid in UIDS:
        cp = cp.with_claim(claimrecord.ClaimRecord(uid, "ns", uid, ClaimState.PREPARE_COMPLETED, devices=DEVICES[:1]))
        prepared.record(cp)
    cp = cp.without_claim("a")
    prepared.record(cp)
    assert compared == [] and shown(metrics) == recount(cp)
    prepared.record(claimrecord.Checkpoint("boot", dict(cp.claims)))  # the same claims, not made from them
    assert compared == [1] and shown(metrics) == recount(cp)


def test_only_the_gauges_whose_value_changed_are_set() -> None:
    """Each set takes the gauge's lock: a whole-GPU claim's write changes the claims and the gpu devices only."""
    metrics = PluginMetrics()
    prepared = PreparedMetrics(metrics)
    sets: list[float] = []
    for gauge in metrics._prepared_gauges:
        real = gauge.set

        def counting(value: float, real: Any = real) -> None:
            sets.append(value)
            real(value)

        gauge.set = counting  # type: ignore[method-assign]
    cp: Checkpoint = claimrecord.Checkpoint("boot")
    prepared.record(cp)
    assert len(sets) == 5  # the first sets all
    sets.clear()
    cp = cp.with_claim(claimrecord.ClaimRecord("a", "ns", "a", ClaimState.PREPARE_COMPLETED, devices=DEVICES[:1]))
    prepared.record(cp)
    assert sets == [1, 1] and shown(metrics) == recount(cp)
