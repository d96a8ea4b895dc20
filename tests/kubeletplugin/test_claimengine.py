"""The claim engine's shared parts on a driver of the test's own (no GPU): what an effect made is written into the
claim's record on disk by device name, a checkpoint write refuses a record that changed, the stale-claim release,
and the ordered effect kinds (undo in reverse, the spec last, sweeps by kind)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from dra_driver.errors import DraDriverError
from dra_driver.k8s.client import ApiError, JsonObject
from dra_driver.kubeletplugin.checkpoint import CheckpointStore
from dra_driver.kubeletplugin.claimengine import RecordChanged, expect_record, made_recorder, release_stale
from dra_driver.kubeletplugin.claimrecord import Checkpoint, ClaimCodec, ClaimRecord, ClaimState
from dra_driver.kubeletplugin.claims import AllocatedClaim
from dra_driver.kubeletplugin.driver import ClaimRef
from dra_driver.kubeletplugin.effect import ClaimEffects, Created, Effect


@dataclass(frozen=True)
class Slot:
    """The test driver's device record: a slot, and the id of what its effect made."""

    request_names: tuple[str, ...]
    pool: str
    device: str
    cdi_device_ids: tuple[str, ...] = ()
    made: str | None = None


@dataclass(frozen=True)
class MadeId:
    value: str

    def record_on(self, device: Slot) -> Slot:
        return replace(device, made=self.value)


class SlotFormat:
    states = frozenset(ClaimState)

    def encode_device(self, device: Slot) -> dict[str, Any]:
        return {"requestNames": list(device.request_names), "pool": device.pool, "device": device.device,
                "cdiDeviceIds": list(device.cdi_device_ids), "made": device.made}

    def decode_device(self, raw: Mapping[str, Any]) -> Slot:
        return Slot(tuple(raw["requestNames"]), str(raw["pool"]), str(raw["device"]), tuple(raw["cdiDeviceIds"]),
                    raw.get("made"))

    def encode_details(self, details: None) -> dict[str, Any]:
        return {}

    def decode_details(self, raw: Mapping[str, Any]) -> None:
        return None


Cp = Checkpoint[Slot, None]
Rec = ClaimRecord[Slot, None]
SLOTS = (Slot(("a",), "pool", "slot-0"), Slot(("a",), "pool", "slot-1"))


def _store(tmp_path: Path) -> CheckpointStore[Cp]:
    (tmp_path / "boot_id").write_text("boot\n")
    return CheckpointStore(tmp_path / "checkpoint.json", ClaimCodec(SlotFormat()), boot_id_path=tmp_path / "boot_id")


def _record(uid: str = "u-1", state: ClaimState = ClaimState.PREPARE_STARTED) -> Rec:
    return ClaimRecord(uid, "ns", f"claim-{uid}", state, devices=SLOTS, allocated=SLOTS)


def test_what_was_made_is_on_disk_in_the_named_device_before_the_call_returns(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.update(lambda cp: cp.with_claim(_record()))
    made_recorder(store, "u-1", ("allocated",))("slot-1", MadeId("instance-7"))
    on_disk = _store(tmp_path).load().claims["u-1"]  # a fresh store reads the file
    assert [d.made for d in on_disk.allocated] == [None, "instance-7"]
    assert [d.made for d in on_disk.devices] == [None, None]
    made_recorder(store, "u-1", ("devices", "allocated"))("slot-0", MadeId("instance-8"))
    on_disk = _store(tmp_path).load().claims["u-1"]
    assert [d.made for d in on_disk.devices] == ["instance-8", None]
    assert [d.made for d in on_disk.allocated] == ["instance-8", "instance-7"]


def test_what_was_made_for_a_record_that_is_gone_fails_the_operation(tmp_path: Path) -> None:
    store = _store(tmp_path)
    with pytest.raises(DraDriverError, match="cannot be recorded"):
        made_recorder(store, "u-9", ("allocated",))("slot-0", MadeId("x"))
    assert store.load().claims == {}


def test_a_write_expecting_a_record_refuses_one_that_changed() -> None:
    record = _record()
    checkpoint: Cp = Checkpoint("boot", {"u-1": record})
    assert expect_record(checkpoint, "u-1", record) is checkpoint
    assert expect_record(checkpoint, "u-1", replace(record)) is checkpoint  # equal is the same record
    with pytest.raises(RecordChanged) as changed:
        expect_record(checkpoint, "u-1", replace(record, state=ClaimState.PREPARE_COMPLETED))
    assert changed.value.record is record
    with pytest.raises(RecordChanged):
        expect_record(checkpoint, "u-2", record)
    assert expect_record(checkpoint, "u-2", None) is checkpoint


class Claims:
    def __init__(self, objects: dict[str, JsonObject | Exception | None]) -> None:
        self.objects = objects

    def get_claim(self, namespace: str, name: str) -> JsonObject | None:
        found = self.objects[name]
        if isinstance(found, Exception):
            raise found
        return found

    def list_claims(self) -> list[JsonObject]:
        return []


def test_release_stale_releases_gone_and_recreated_claims_only() -> None:
    records = [_record(uid) for uid in ("kept", "gone", "recreated", "unreadable", "refused")]
    claims = Claims({
        "claim-kept": {"metadata": {"uid": "kept"}},
        "claim-gone": None,
        "claim-recreated": {"metadata": {"uid": "another"}},
        "claim-unreadable": ApiError(503, "unavailable"),
        "claim-refused": None,
    })
    released: list[str] = []

    def release(ref: ClaimRef) -> str:
        released.append(ref.uid)
        return "busy" if ref.uid == "refused" else ""

    assert release_stale(records, claims, release) == ["gone", "recreated"]
    assert released == ["gone", "recreated", "refused"]


class Step(Effect[str, Slot, None, None]):
    def __init__(self, kind: str, calls: list[str]) -> None:
        self.kind = kind
        self.calls = calls

    def holds(self, record: Rec) -> bool:
        return self.kind == "holder"

    def undo(self, record: Rec, devices: tuple[Slot, ...], checkpoint: Cp, *, rollback: bool) -> None:
        self.calls.append(f"undo {self.kind}")

    def apply(self, claim: str, records: tuple[Slot, ...], checkpoint: Cp, created: Created[Slot]) -> tuple[Slot, ...]:
        self.calls.append(f"apply {self.kind}")
        return records

    def ready(self, claim: str) -> str:
        return "not yet" if self.kind == "slow" else ""

    def sweep(self, checkpoint: Cp, allocated: Mapping[str, AllocatedClaim] | None, node: None) -> tuple[str, ...]:
        self.calls.append(f"sweep {self.kind}")
        return (f"{self.kind}-leftover",) if self.kind != "clean" else ()


def test_the_effect_kinds_apply_in_order_undo_in_reverse_and_sweep_spec_first() -> None:
    calls: list[str] = []
    effects = ClaimEffects(devices=(Step("holder", calls), Step("slow", calls), Step("clean", calls)),
                           spec=Step("spec", calls))
    record, checkpoint = _record(), Checkpoint[Slot, None]()

    def nothing(name: str, made: object) -> None:
        raise AssertionError("nothing is made here")

    effects.apply_devices("plan", SLOTS, checkpoint, nothing)
    undone: list[str] = []
    effects.undo_devices(record, SLOTS, checkpoint, rollback=True, after=lambda e: undone.append(e.kind))
    assert calls == ["apply holder", "apply slow", "apply clean", "undo clean", "undo slow", "undo holder"]
    assert undone == ["clean", "slow", "holder"]  # the spec is not a device effect: the engine undoes it after
    assert effects.holds(record) and effects.ready("plan") == "not yet"
    calls.clear()
    assert effects.sweep(checkpoint, None, None) == {"spec": ("spec-leftover",), "slow": ("slow-leftover",),
                                                     "holder": ("holder-leftover",)}
    assert calls == ["sweep spec", "sweep clean", "sweep slow", "sweep holder"]
