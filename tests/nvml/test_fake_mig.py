"""MIG semantics of the fake (docs/reference/nvml-mig.md §3.3, §4): every error path, id allocation, CI rules,
MIG devices, mode toggling on Hopper and Ampere, and a property over create/destroy sequences."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from functools import partial
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dra_driver.nvml.fake.backend import FakeNvml, FakeSettings
from dra_driver.nvml.types import ComputeMode, MigMode, NvmlError, NvmlReturn, Placement
from tests.narrow import present

P = Placement
# H100 profile ids
GI_7G, GI_4G, GI_3G, GI_2G, GI_1G, GI_1G_ME, GI_1G_2X = 0, 5, 9, 14, 19, 20, 15


def _fake(preset: str = "dgx-h100", **opts: Any) -> tuple[FakeNvml, str]:
    fake = FakeNvml.preset(preset, settings=FakeSettings(**opts))
    fake.init()
    return fake, fake.gpus()[0].uuid


def _mig_on(preset: str = "dgx-h100", **opts: Any) -> tuple[FakeNvml, str]:
    fake, gpu = _fake(preset, **opts)
    if preset in ("dgx-h100", "hgx-h200"):
        assert fake.set_mig_mode(gpu, True) is NvmlReturn.SUCCESS
    elif preset == "a30x4":
        fake.set_mig_mode(gpu, True)
        fake.reset_gpu(gpu)
    assert fake.mig_mode(gpu) == MigMode(True, True)
    return fake, gpu


def _code(call: Callable[[], object]) -> NvmlReturn:
    with pytest.raises(NvmlError) as err:
        call()
    return err.value.code


# --- GPU instances --------------------------------------------------------------------------------


def test_create_gi_with_mig_off_is_not_supported() -> None:
    fake, gpu = _fake()
    with pytest.raises(NvmlError) as err:
        fake.create_gpu_instance(gpu, GI_1G, P(0, 1))
    assert err.value.code is NvmlReturn.NOT_SUPPORTED
    assert err.value.call == "create_gpu_instance"


@pytest.mark.parametrize(
    ("profile_id", "placement", "code"),
    [
        (99, P(0, 1), NvmlReturn.INVALID_ARGUMENT),  # unknown profile
        (21, P(0, 1), NvmlReturn.INVALID_ARGUMENT),  # an A30 id, unknown on H100
        (GI_3G, P(2, 4), NvmlReturn.INVALID_ARGUMENT),  # start not in {0, 4}
        (GI_3G, P(0, 3), NvmlReturn.INVALID_ARGUMENT),  # wrong size
        (GI_1G, P(7, 1), NvmlReturn.INVALID_ARGUMENT),  # 1g never sits on the 8th memory slice
        (GI_7G, P(0, 8), None),
        (GI_1G_2X, P(6, 2), None),
    ],
)
def test_profile_and_placement_validation(profile_id: int, placement: Placement, code: NvmlReturn | None) -> None:
    fake, gpu = _mig_on()
    if code is None:
        gi = fake.create_gpu_instance(gpu, profile_id, placement)
        assert (gi.profile_id, gi.placement, gi.gpu_uuid) == (profile_id, placement, gpu)
    else:
        assert _code(lambda: fake.create_gpu_instance(gpu, profile_id, placement)) is code
        assert fake.gpu_instances(gpu) == []


def test_memory_slice_overlap_is_insufficient_resources() -> None:
    fake, gpu = _mig_on()
    fake.create_gpu_instance(gpu, GI_3G, P(4, 4))
    for profile_id, placement in ((GI_1G, P(5, 1)), (GI_2G, P(4, 2)), (GI_1G_2X, P(6, 2)), (GI_7G, P(0, 8))):
        code = _code(partial(fake.create_gpu_instance, gpu, profile_id, placement))
        assert code is NvmlReturn.INSUFFICIENT_RESOURCES, (profile_id, placement)
    fake.create_gpu_instance(gpu, GI_4G, P(0, 4))  # the other half is free
    assert [g.placement for g in fake.gpu_instances(gpu)] == [P(4, 4), P(0, 4)]


def test_instance_count_limit_is_insufficient_resources() -> None:
    fake, gpu = _mig_on()
    fake.create_gpu_instance(gpu, GI_1G_ME, P(0, 1))  # 1g.10gb+me: instance_count 1
    assert _code(lambda: fake.create_gpu_instance(gpu, GI_1G_ME, P(3, 1))) is NvmlReturn.INSUFFICIENT_RESOURCES
    fake.create_gpu_instance(gpu, GI_1G, P(3, 1))  # the plain 1g still fits there


def test_gi_ids_are_the_lowest_free_in_the_size_range() -> None:
    fake, gpu = _mig_on()
    steps = [
        (GI_1G, P(0, 1), 7),
        (GI_1G, P(1, 1), 8),
        (GI_2G, P(2, 2), 3),
        (GI_3G, P(4, 4), 1),
    ]
    for profile_id, placement, gi_id in steps:
        assert fake.create_gpu_instance(gpu, profile_id, placement).id == gi_id
    fake.destroy_gpu_instance(gpu, 7)
    assert fake.create_gpu_instance(gpu, GI_1G, P(0, 1)).id == 7  # freed id is reused first
    assert [g.id for g in fake.gpu_instances(gpu)] == [1, 3, 7, 8]  # ordered by GI id


@pytest.mark.parametrize(
    ("placements", "ids"),
    [
        ([(GI_7G, P(0, 8))], [0]),
        ([(GI_3G, P(4, 4)), (GI_3G, P(0, 4))], [1, 2]),  # GI ids are not a function of placement
        ([(GI_2G, P(4, 2)), (GI_2G, P(0, 2)), (GI_2G, P(2, 2)), (GI_1G_2X, P(6, 2))], [3, 4, 5, 6]),
        ([(GI_1G, P(i, 1)) for i in range(7)], [7, 8, 9, 10, 11, 12, 13]),
    ],
)
def test_gi_id_ranges_on_8_slice_gpus(placements: list[tuple[int, Placement]], ids: list[int]) -> None:
    fake, gpu = _mig_on()
    assert [fake.create_gpu_instance(gpu, p, pl).id for p, pl in placements] == ids


def test_gi_id_ranges_on_the_a30() -> None:
    fake, gpu = _mig_on("a30x4")
    assert fake.create_gpu_instance(gpu, 0, P(0, 4)).id == 0  # 4g.24gb
    fake.destroy_gpu_instance(gpu, 0)
    assert fake.create_gpu_instance(gpu, 5, P(2, 2)).id == 1  # 2g.12gb
    assert fake.create_gpu_instance(gpu, 14, P(0, 1)).id == 3  # 1g.6gb
    assert fake.create_gpu_instance(gpu, 14, P(1, 1)).id == 4
    assert _code(lambda: fake.create_gpu_instance(gpu, 14, P(2, 1))) is NvmlReturn.INSUFFICIENT_RESOURCES


def test_destroy_gi_errors() -> None:
    fake, gpu = _mig_on()
    gi = fake.create_gpu_instance(gpu, GI_3G, P(0, 4))
    assert _code(lambda: fake.destroy_gpu_instance(gpu, 2)) is NvmlReturn.NOT_FOUND
    ci = fake.create_compute_instance(gpu, gi.id, 2)
    assert _code(lambda: fake.destroy_gpu_instance(gpu, gi.id)) is NvmlReturn.IN_USE  # has a CI
    fake.destroy_compute_instance(gpu, gi.id, ci.id)
    fake.set_busy(gpu, [101], gi=gi.id)
    assert _code(lambda: fake.destroy_gpu_instance(gpu, gi.id)) is NvmlReturn.IN_USE  # processes on the GI
    fake.set_busy(gpu, [], gi=gi.id)
    fake.destroy_gpu_instance(gpu, gi.id)
    assert fake.gpu_instances(gpu) == []


def test_mig_off_makes_instance_calls_not_supported() -> None:
    fake, gpu = _fake()
    calls: list[Callable[[], object]] = [
        lambda: fake.gpu_instances(gpu),
        lambda: fake.destroy_gpu_instance(gpu, 0),
        lambda: fake.compute_instance_profiles(gpu, 0),
        lambda: fake.create_compute_instance(gpu, 0, 0),
        lambda: fake.destroy_compute_instance(gpu, 0, 0),
        lambda: fake.compute_instances(gpu, 0),
    ]
    assert [_code(c) for c in calls] == [NvmlReturn.NOT_SUPPORTED] * len(calls)
    assert fake.mig_devices(gpu) == []  # no MIG devices while MIG is off


def test_non_mig_gpu_refuses_every_mig_call() -> None:
    fake, gpu = _fake("l4x2")
    assert fake.mig_mode(gpu) is None
    calls: list[Callable[[], object]] = [
        lambda: fake.set_mig_mode(gpu, True),
        lambda: fake.gpu_instance_profiles(gpu),
        lambda: fake.create_gpu_instance(gpu, 19, P(0, 1)),
        lambda: fake.gpu_instances(gpu),
        lambda: fake.destroy_gpu_instance(gpu, 0),
        lambda: fake.compute_instance_profiles(gpu, 0),
        lambda: fake.create_compute_instance(gpu, 0, 0),
        lambda: fake.compute_instances(gpu, 0),
        lambda: fake.mig_devices(gpu),
    ]
    assert [_code(c) for c in calls] == [NvmlReturn.NOT_SUPPORTED] * len(calls)


def test_unknown_gpu_uuid_is_not_found() -> None:
    fake, _ = _fake()
    assert _code(lambda: fake.mig_mode("GPU-00000000-0000-0000-0000-000000000000")) is NvmlReturn.NOT_FOUND


# --- compute instances ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gi_profile", "placement", "ci_counts"),
    [
        # GI profile, placement, {CI compute slices: instance count}
        (GI_1G, P(0, 1), {1: 1}),
        (GI_2G, P(0, 2), {1: 2, 2: 1}),
        (GI_3G, P(0, 4), {1: 3, 2: 1, 3: 1}),
        (GI_4G, P(0, 4), {1: 4, 2: 2, 4: 1}),
        (GI_7G, P(0, 8), {1: 7, 2: 3, 3: 2, 4: 1, 7: 1}),
    ],
)
def test_ci_profiles_offered_per_gi_size(gi_profile: int, placement: Placement, ci_counts: dict[int, int]) -> None:
    fake, gpu = _mig_on()
    gi = fake.create_gpu_instance(gpu, gi_profile, placement)
    profiles = fake.compute_instance_profiles(gpu, gi.id)
    assert {p.slice_count: p.instance_count for p in profiles} == ci_counts
    expected_id = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4}
    assert [p.id for p in profiles] == [expected_id[c] for c in sorted(ci_counts)]
    assert all(p.id == p.index for p in profiles)
    gi_sms = next(p.multiprocessors for p in fake.gpu_instance_profiles(gpu) if p.id == gi_profile)
    assert profiles[-1].multiprocessors == gi_sms  # the full CI has all of the GI's SMs
    assert all(p.multiprocessors < gi_sms for p in profiles[:-1])
    # The offered counts are really creatable: fill the GI with the smallest CI.
    ids = [fake.create_compute_instance(gpu, gi.id, profiles[0].id).id for _ in range(profiles[0].instance_count)]
    assert ids == list(range(profiles[0].instance_count))
    assert _code(lambda: fake.create_compute_instance(gpu, gi.id, profiles[0].id)) is NvmlReturn.INSUFFICIENT_RESOURCES


def test_ci_profile_errors_and_slice_overlap() -> None:
    fake, gpu = _mig_on()
    gi = fake.create_gpu_instance(gpu, GI_3G, P(0, 4))
    assert _code(lambda: fake.create_compute_instance(gpu, gi.id, 99)) is NvmlReturn.INVALID_ARGUMENT
    assert _code(lambda: fake.create_compute_instance(gpu, gi.id, 4)) is NvmlReturn.NOT_SUPPORTED  # 7-slice in 3g
    assert _code(lambda: fake.create_compute_instance(gpu, 5, 0)) is NvmlReturn.NOT_FOUND
    assert _code(lambda: fake.compute_instance_profiles(gpu, 5)) is NvmlReturn.NOT_FOUND
    two = fake.create_compute_instance(gpu, gi.id, 1)  # 2 slices at 0-1
    assert _code(lambda: fake.create_compute_instance(gpu, gi.id, 2)) is NvmlReturn.INSUFFICIENT_RESOURCES
    one = fake.create_compute_instance(gpu, gi.id, 0)  # 1 slice at 2
    assert _code(lambda: fake.create_compute_instance(gpu, gi.id, 0)) is NvmlReturn.INSUFFICIENT_RESOURCES
    assert (two.id, one.id) == (0, 1)
    assert [c.id for c in fake.compute_instances(gpu, gi.id)] == [0, 1]


def test_ci_ids_are_lowest_free_from_zero() -> None:
    fake, gpu = _mig_on()
    gi = fake.create_gpu_instance(gpu, GI_7G, P(0, 8))
    assert [fake.create_compute_instance(gpu, gi.id, 0).id for _ in range(3)] == [0, 1, 2]
    fake.destroy_compute_instance(gpu, gi.id, 1)
    assert fake.create_compute_instance(gpu, gi.id, 0).id == 1
    assert _code(lambda: fake.destroy_compute_instance(gpu, gi.id, 6)) is NvmlReturn.NOT_FOUND
    assert _code(lambda: fake.destroy_compute_instance(gpu, 9, 0)) is NvmlReturn.NOT_FOUND
    assert _code(lambda: fake.compute_instances(gpu, 9)) is NvmlReturn.NOT_FOUND


def test_busy_compute_instance_cannot_be_destroyed() -> None:
    fake, gpu = _mig_on()
    gi = fake.create_gpu_instance(gpu, GI_1G, P(0, 1))
    ci = fake.create_compute_instance(gpu, gi.id, 0)
    fake.set_busy(gpu, [4242], gi=gi.id, ci=ci.id)
    assert _code(lambda: fake.destroy_compute_instance(gpu, gi.id, ci.id)) is NvmlReturn.IN_USE
    fake.set_busy(gpu, (), gi=gi.id, ci=ci.id)
    fake.destroy_compute_instance(gpu, gi.id, ci.id)
    assert fake.compute_instances(gpu, gi.id) == []


# --- MIG devices ----------------------------------------------------------------------------------


def test_mig_device_uuids_and_index_order() -> None:
    fake, gpu = _mig_on()
    small = fake.create_gpu_instance(gpu, GI_1G, P(0, 1))  # GI 7, created first
    big = fake.create_gpu_instance(gpu, GI_3G, P(4, 4))  # GI 1, created second
    fake.create_compute_instance(gpu, small.id, 0)
    fake.create_compute_instance(gpu, big.id, 0)
    fake.create_compute_instance(gpu, big.id, 0)
    devices = fake.mig_devices(gpu)
    assert [(d.gpu_instance_id, d.compute_instance_id, d.index) for d in devices] == [(1, 0, 0), (1, 1, 1), (7, 0, 2)]
    parent = uuid.UUID(gpu.removeprefix("GPU-"))
    for d in devices:
        assert d.uuid == "MIG-" + str(uuid.uuid5(parent, f"{d.gpu_instance_id}/{d.compute_instance_id}"))
        assert d.uuid[4:].split("-")[2].startswith("5")  # version-5 UUID, like real captures
        assert d.parent_uuid == gpu
    assert devices[0].memory_bytes == 40448 * 1024 * 1024
    assert devices[2].memory_bytes == 9984 * 1024 * 1024
    # Deterministic: a second fake node with the same history yields the same UUIDs.
    again, gpu2 = _mig_on()
    assert gpu2 == gpu
    again.create_gpu_instance(gpu, GI_3G, P(4, 4))
    again.create_compute_instance(gpu, 1, 0)
    assert again.mig_devices(gpu)[0].uuid == devices[0].uuid


def test_mig_uuids_differ_between_parents() -> None:
    fake, _ = _mig_on("dgx-a100")
    uuids = set()
    for g in fake.gpus()[:2]:
        gi = fake.create_gpu_instance(g.uuid, 0, P(0, 8))
        fake.create_compute_instance(g.uuid, gi.id, 4)
        uuids |= {d.uuid for d in fake.mig_devices(g.uuid)}
    assert len(uuids) == 2


# --- MIG mode -------------------------------------------------------------------------------------


def test_hopper_toggles_without_reset() -> None:
    fake, gpu = _fake()
    assert fake.set_mig_mode(gpu, True) is NvmlReturn.SUCCESS
    assert fake.mig_mode(gpu) == MigMode(True, True)
    gi = fake.create_gpu_instance(gpu, GI_7G, P(0, 8))
    assert fake.set_mig_mode(gpu, False) is NvmlReturn.IN_USE  # GIs present
    assert fake.mig_mode(gpu) == MigMode(True, True)
    fake.destroy_gpu_instance(gpu, gi.id)
    fake.set_busy(gpu, [77])
    assert fake.set_mig_mode(gpu, False) is NvmlReturn.IN_USE  # processes on the GPU
    assert fake.mig_mode(gpu) == MigMode(True, True)
    fake.set_busy(gpu, [])
    assert fake.set_mig_mode(gpu, False) is NvmlReturn.SUCCESS
    assert fake.mig_mode(gpu) == MigMode(False, False)
    assert fake.set_mig_mode(gpu, False) is NvmlReturn.SUCCESS  # idempotent


def test_ampere_sets_pending_until_reset() -> None:
    fake, gpu = _fake("a30x4")
    assert fake.set_mig_mode(gpu, True) is NvmlReturn.SUCCESS
    assert fake.mig_mode(gpu) == MigMode(current=False, pending=True)
    assert present(fake.mig_mode(gpu)).change_pending
    assert _code(lambda: fake.create_gpu_instance(gpu, 14, P(0, 1))) is NvmlReturn.NOT_SUPPORTED
    fake.reset_gpu(gpu)
    assert fake.mig_mode(gpu) == MigMode(True, True)
    fake.create_gpu_instance(gpu, 14, P(0, 1))
    # Disabling: refused while GIs exist; once clear, pending until reset, which also drops GIs.
    assert fake.set_mig_mode(gpu, False) is NvmlReturn.IN_USE
    fake.destroy_gpu_instance(gpu, 3)
    assert fake.set_mig_mode(gpu, False) is NvmlReturn.SUCCESS
    assert fake.mig_mode(gpu) == MigMode(current=True, pending=False)
    fake.create_gpu_instance(gpu, 0, P(0, 4))  # still MIG until the reset
    fake.reset_gpu(gpu)
    assert fake.mig_mode(gpu) == MigMode(False, False)
    assert fake.state().gpu(gpu).gis == ()


def test_ampere_reset_refuses_a_busy_gpu() -> None:
    fake, gpu = _fake("a30x4")
    fake.set_mig_mode(gpu, True)
    fake.set_busy(gpu, [1, 2])
    assert _code(lambda: fake.reset_gpu(gpu)) is NvmlReturn.IN_USE
    assert fake.mig_mode(gpu) == MigMode(False, True)


@pytest.mark.parametrize(
    ("opts", "busy", "status", "mode"),
    [
        ({}, False, NvmlReturn.SUCCESS, MigMode(False, True)),
        ({}, True, NvmlReturn.IN_USE, MigMode(False, True)),
        ({"auto_reset": True}, False, NvmlReturn.SUCCESS, MigMode(True, True)),
        ({"auto_reset": True}, True, NvmlReturn.IN_USE, MigMode(False, True)),
        ({"passthrough": True}, False, NvmlReturn.RESET_REQUIRED, MigMode(False, True)),
        ({"passthrough": True, "auto_reset": True}, False, NvmlReturn.RESET_REQUIRED, MigMode(False, True)),
    ],
)
def test_ampere_activation_status(opts: dict[str, bool], busy: bool, status: NvmlReturn, mode: MigMode) -> None:
    fake, gpu = _fake("a30x4", **opts)
    if busy:
        fake.set_busy(gpu, [9])
    assert fake.set_mig_mode(gpu, True) is status
    assert fake.mig_mode(gpu) == mode


@pytest.mark.parametrize(
    ("preset", "policy", "works"),
    [
        ("dgx-h100", "auto", True),
        ("a30x4", "auto", False),
        ("a30x4", "supported", True),
        ("dgx-h100", "not_supported", False),
    ],
)
def test_gi_profile_queries_with_mig_disabled(preset: str, policy: str, works: bool) -> None:
    fake, gpu = _fake(preset, profiles_when_mig_disabled=policy)
    assert not present(fake.mig_mode(gpu)).current
    if works:
        assert len(fake.gpu_instance_profiles(gpu)) >= 5
    else:
        assert _code(lambda: fake.gpu_instance_profiles(gpu)) is NvmlReturn.NOT_SUPPORTED


def test_compute_mode() -> None:
    fake, gpu = _fake()
    assert fake.compute_mode(gpu) is ComputeMode.DEFAULT
    fake.set_compute_mode(gpu, ComputeMode.EXCLUSIVE_PROCESS)
    assert fake.compute_mode(gpu) is ComputeMode.EXCLUSIVE_PROCESS
    assert _code(lambda: fake.set_compute_mode(gpu, ComputeMode.EXCLUSIVE_THREAD)) is NvmlReturn.NOT_SUPPORTED
    assert fake.compute_mode(fake.gpus()[1].uuid) is ComputeMode.DEFAULT


def test_set_busy_validates_its_target() -> None:
    fake, gpu = _mig_on()
    assert _code(lambda: fake.set_busy(gpu, [1], gi=3)) is NvmlReturn.NOT_FOUND
    with pytest.raises(ValueError, match="gi="):
        fake.set_busy(gpu, [1], ci=0)
    with pytest.raises(ValueError, match="positive"):
        fake.set_busy(gpu, [0])
    with pytest.raises(ValueError, match="unknown GPU uuid"):
        fake.set_busy("GPU-nope", [1])


# --- property -------------------------------------------------------------------------------------

_H100 = FakeNvml.preset("dgx-h100").node.gpus[0].model.mig
assert _H100 is not None
_CREATES = [(p.id, pl) for p in _H100.profiles for pl in p.placements] + [(99, P(0, 1)), (GI_3G, P(2, 4))]
_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("create"), st.sampled_from(_CREATES)),
        st.tuples(st.just("destroy"), st.integers(min_value=0, max_value=15)),
    ),
    max_size=30,
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=_OPS)
def test_any_create_destroy_sequence_keeps_gis_disjoint_and_within_counts(ops: list[tuple[str, Any]]) -> None:
    fake, gpu = _mig_on()
    profiles = {p.id: p for p in fake.gpu_instance_profiles(gpu)}
    for op, arg in ops:
        try:
            if op == "create":
                profile_id, placement = arg
                gi = fake.create_gpu_instance(gpu, profile_id, placement)
                assert gi.id in {1: range(7, 15), 2: range(3, 7), 4: range(1, 3), 8: range(0, 1)}[placement.size]
            else:
                fake.destroy_gpu_instance(gpu, arg)
        except NvmlError as exc:
            assert exc.code in (NvmlReturn.INSUFFICIENT_RESOURCES, NvmlReturn.INVALID_ARGUMENT, NvmlReturn.NOT_FOUND)
        live = fake.gpu_instances(gpu)
        assert len({g.id for g in live}) == len(live)
        for a_index, a in enumerate(live):
            assert a.placement in profiles[a.profile_id].placements
            for b in live[a_index + 1 :]:
                assert not a.placement.overlaps(b.placement), (a, b)
        for pid, profile in profiles.items():
            assert sum(1 for g in live if g.profile_id == pid) <= profile.instance_count


def test_one_instance_is_safe_under_concurrent_prepares() -> None:
    """The prepare engine calls one backend from many threads: every slot is booked exactly once."""
    fake, _ = _mig_on("dgx-a100")
    uuids = [g.uuid for g in fake.gpus()[:4]]
    won: list[tuple[str, int]] = []
    lock = threading.Lock()

    def worker() -> None:
        for gpu in uuids:
            for start in range(7):
                try:
                    gi = fake.create_gpu_instance(gpu, 19, P(start, 1))
                    fake.create_compute_instance(gpu, gi.id, 0)
                except NvmlError as exc:
                    assert exc.code is NvmlReturn.INSUFFICIENT_RESOURCES
                else:
                    with lock:
                        won.append((gpu, gi.id))

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(won) == sorted((g, i) for g in uuids for i in range(7, 14))
    assert all(len(fake.mig_devices(g)) == 7 for g in uuids)
