"""Lifecycle, fault injection, health events and GPU loss in the fake NVML."""

from __future__ import annotations

import inspect
import threading
import time
from typing import Any

import pytest

from dra_driver.nvml.backend import NvmlBackend
from dra_driver.nvml.fake.backend import CALL_LOG_LIMIT, CALL_NAMES, FakeNvml
from dra_driver.nvml.types import (
    EVENT_DOUBLE_BIT_ECC,
    EVENT_SINGLE_BIT_ECC,
    EVENT_XID_CRITICAL,
    NO_INSTANCE,
    ComputeMode,
    GpuEvent,
    NvmlError,
    NvmlReturn,
    NvmlUnavailableError,
    Placement,
    TimeSlice,
)

ALL = EVENT_XID_CRITICAL | EVENT_DOUBLE_BIT_ECC | EVENT_SINGLE_BIT_ECC


def _fake(preset: str = "dgx-h100") -> FakeNvml:
    fake = FakeNvml.preset(preset)
    fake.init()
    return fake


# --- lifecycle and faults -------------------------------------------------------------------------


def test_call_names_are_exactly_the_protocol_methods() -> None:
    protocol = {
        name for name, member in inspect.getmembers(NvmlBackend, inspect.isfunction) if not name.startswith("_")
    }
    assert set(CALL_NAMES) == protocol
    assert isinstance(FakeNvml.preset("l4x2"), NvmlBackend)


def test_calls_before_init_are_uninitialized_and_init_is_refcounted() -> None:
    fake = FakeNvml.preset("l4x2")
    with pytest.raises(NvmlError) as err:
        fake.gpus()
    assert (err.value.code, err.value.call) == (NvmlReturn.UNINITIALIZED, "gpus")
    fake.init()
    fake.init()
    fake.shutdown()
    assert len(fake.gpus()) == 2  # one init still open
    fake.shutdown()
    with pytest.raises(NvmlError) as err:
        fake.shutdown()
    assert err.value.code is NvmlReturn.UNINITIALIZED


def test_injected_init_failure_is_nvml_unavailable() -> None:
    fake = FakeNvml.preset("l4x2")
    fake.inject_fault("init", NvmlReturn.DRIVER_NOT_LOADED)
    with pytest.raises(NvmlUnavailableError, match="DRIVER_NOT_LOADED"):
        fake.init()
    fake.init()  # only the next call failed
    assert fake.system_info().driver_version == "580.105.08"


def _args_for(fake: FakeNvml, call: str) -> tuple[Any, ...]:
    a, b = (g.uuid for g in fake.gpus()[:2])
    table: dict[str, tuple[Any, ...]] = {
        "init": (),
        "shutdown": (),
        "system_info": (),
        "gpus": (),
        "fabric_manager": (),
        "topology_common_ancestor": (a, b),
        "nvlink_p2p_ok": (a, b),
        "set_compute_mode": (a, ComputeMode.DEFAULT),
        "set_time_slice": (a, TimeSlice.LONG),
        "set_mig_mode": (a, True),
        "set_persistence_mode": (a, True),
        "create_gpu_instance": (a, 19, Placement(0, 1)),
        "destroy_gpu_instance": (a, 7),
        "compute_instance_profiles": (a, 7),
        "create_compute_instance": (a, 7, 0),
        "destroy_compute_instance": (a, 7, 0),
        "compute_instances": (a, 7),
        "register_events": ([a], ALL),
        "wait_event": (0,),
    }
    return table.get(call, (a,))


@pytest.mark.parametrize("call", [c for c in CALL_NAMES if c != "init"])
def test_every_protocol_call_can_be_made_to_fail(call: str) -> None:
    fake = _fake("dgx-a100")  # MIG on, so the MIG calls have something to do
    fake.inject_fault(call, NvmlReturn.UNKNOWN, count=2)
    method = getattr(fake, call)
    for _ in range(2):
        with pytest.raises(NvmlError) as err:
            method(*_args_for(fake, call))
        assert (err.value.code, err.value.call) == (NvmlReturn.UNKNOWN, call)
    if call == "shutdown":
        return
    if call in (
        "destroy_gpu_instance",
        "compute_instance_profiles",
        "create_compute_instance",
        "compute_instances",
        "destroy_compute_instance",
    ):
        fake.create_gpu_instance(fake.gpus()[0].uuid, 19, Placement(0, 1))  # GI 7 for the call to act on
    if call == "destroy_compute_instance":
        fake.create_compute_instance(fake.gpus()[0].uuid, 7, 0)
    method(*_args_for(fake, call))  # the third call is back to normal


def test_fault_injection_rejects_bad_arguments_and_can_be_cleared() -> None:
    fake = _fake()
    with pytest.raises(ValueError, match="create_gpu_instance"):
        fake.inject_fault("nvmlDeviceCreateGpuInstance", NvmlReturn.UNKNOWN)
    with pytest.raises(ValueError, match="count"):
        fake.inject_fault("gpus", NvmlReturn.UNKNOWN, count=0)
    fake.inject_fault("gpus", NvmlReturn.UNKNOWN, count=5)
    fake.clear_faults()
    assert len(fake.gpus()) == 8


def test_calls_are_recorded_in_order() -> None:
    fake = _fake("l4x2")
    uuid = fake.gpus()[0].uuid
    fake.mig_mode(uuid)
    fake.nvlinks(uuid)
    assert fake.calls() == ["init", "gpus", "mig_mode", "nvlinks"]


def test_the_call_log_keeps_only_the_most_recent_calls() -> None:
    """A fake plugin serving for days must not grow by every NVML call it answers."""
    fake = _fake("l4x2")
    uuid = fake.gpus()[0].uuid
    for _ in range(CALL_LOG_LIMIT):
        fake.mig_mode(uuid)
    fake.nvlinks(uuid)
    calls = fake.calls()
    assert len(calls) == CALL_LOG_LIMIT
    assert calls[-2:] == ["mig_mode", "nvlinks"] and "init" not in calls and "gpus" not in calls


# --- events ---------------------------------------------------------------------------------------


def test_register_returns_the_supported_mask() -> None:
    fake = _fake()
    uuids = [g.uuid for g in fake.gpus()]
    assert fake.register_events(uuids, 0xFFFF) == ALL
    assert fake.register_events(uuids[:1], EVENT_XID_CRITICAL | 0x4) == EVENT_XID_CRITICAL
    with pytest.raises(NvmlError) as err:
        fake.register_events(["GPU-nope"], ALL)
    assert err.value.code is NvmlReturn.NOT_FOUND


def test_wait_event_with_an_empty_queue_returns_at_once_or_after_its_timeout() -> None:
    fake = _fake()
    fake.register_events([fake.gpus()[0].uuid], ALL)
    start = time.monotonic()
    assert fake.wait_event(0) is None
    assert time.monotonic() - start < 0.05
    start = time.monotonic()
    assert fake.wait_event(30) is None
    elapsed = time.monotonic() - start
    assert 0.02 <= elapsed < 1.0


def test_xid_and_ecc_events_are_delivered_in_order() -> None:
    fake = _fake("dgx-a100")
    a, b = (g.uuid for g in fake.gpus()[:2])
    fake.register_events([a, b], ALL)
    gi = fake.create_gpu_instance(b, 9, Placement(0, 4))
    ci = fake.create_compute_instance(b, gi.id, 2)
    assert fake.inject_xid(a, 79)
    assert fake.inject_xid(b, 31, gi=gi.id, ci=ci.id)
    assert fake.inject_ecc(a, double_bit=False)
    assert fake.wait_event(0) == GpuEvent(a, EVENT_XID_CRITICAL, 79, NO_INSTANCE, NO_INSTANCE)
    assert fake.wait_event(0) == GpuEvent(b, EVENT_XID_CRITICAL, 31, gi.id, ci.id)
    assert fake.wait_event(0) == GpuEvent(a, EVENT_SINGLE_BIT_ECC, 0)
    assert fake.wait_event(0) is None
    with pytest.raises(ValueError, match="gi=5"):
        fake.inject_xid(b, 43, gi=5)


def test_events_for_unregistered_gpus_or_types_are_dropped() -> None:
    fake = _fake()
    a, b = (g.uuid for g in fake.gpus()[:2])
    assert not fake.inject_xid(a, 48)  # nobody registered yet: lost, as in NVML
    fake.register_events([a], EVENT_XID_CRITICAL)
    assert not fake.inject_xid(b, 48)
    assert not fake.inject_ecc(a)
    assert fake.wait_event(0) is None


def test_a_waiting_thread_wakes_up_on_an_event() -> None:
    fake = _fake()
    uuid = fake.gpus()[3].uuid
    fake.register_events([uuid], ALL)
    got: list[GpuEvent | None] = []
    waiter = threading.Thread(target=lambda: got.append(fake.wait_event(10_000)))
    start = time.monotonic()
    waiter.start()
    fake.inject_xid(uuid, 94)
    waiter.join(timeout=10)
    assert not waiter.is_alive()
    assert got == [GpuEvent(uuid, EVENT_XID_CRITICAL, 94)]
    assert time.monotonic() - start < 5  # woken by the event, not by the 10 s timeout


def test_a_lost_gpu_raises_from_wait_and_from_calls_until_reset() -> None:
    fake = _fake()
    lost, healthy = (g.uuid for g in fake.gpus()[:2])
    fake.register_events([lost, healthy], ALL)
    fake.inject_gpu_lost(lost)
    with pytest.raises(NvmlError) as err:
        fake.wait_event(0)
    assert (err.value.code, err.value.detail) == (NvmlReturn.GPU_IS_LOST, lost)
    for call in (fake.mig_mode, fake.compute_mode, fake.nvlinks):
        with pytest.raises(NvmlError) as err:
            call(lost)
        assert err.value.code is NvmlReturn.GPU_IS_LOST
    assert fake.mig_mode(healthy) is not None
    assert len(fake.gpus()) == 8  # still enumerated
    fake.reset_gpu(lost)
    assert fake.compute_mode(lost) is ComputeMode.DEFAULT
