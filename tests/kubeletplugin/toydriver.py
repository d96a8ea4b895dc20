"""A toy DRA driver built on the kubelet-plugin layer alone: the proof that another driver reuses it unchanged.

`toy.example.com` offers one device per node, `slot-0`, and prepares a claim by writing a CDI spec for it and
recording the claim in its own checkpoint. It imports nothing of the GPU driver (no plugin, nvml, inventory, slices,
cdi or claimconfig package): the layer gives it the sockets, the registration, both DRA API versions, the claim
reader, the state dirs with the operation lock and a crash-safe checkpoint store over its own record format.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from dra_driver.k8s.client import ApiError, JsonObject
from dra_driver.kubeletplugin.checkpoint import CheckpointStore, CorruptCheckpointError
from dra_driver.kubeletplugin.claims import ClaimSource
from dra_driver.kubeletplugin.driver import ClaimRef, DeviceResult, PrepareResult
from dra_driver.kubeletplugin.server import PluginServer
from dra_driver.kubeletplugin.statedirs import OPERATION_LOCK_NAME, OperationLock, prepare_plugin_dir

TOY_DRIVER = "toy.example.com"
TOY_DEVICE = "slot-0"
CDI_KIND = f"{TOY_DRIVER}/slot"


@dataclass(frozen=True)
class ToyRecords:
    """What the toy driver remembers: claim UID -> the CDI device ids it handed out."""

    boot_id: str = ""
    claims: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


class ToyCodec:
    """The toy's checkpoint format: plain JSON, nothing like the GPU driver's."""

    def encode(self, value: ToyRecords) -> bytes:
        return json.dumps({"boot": value.boot_id, "claims": {u: list(c) for u, c in value.claims.items()}}).encode()

    def decode(self, raw: bytes) -> ToyRecords:
        try:
            doc = json.loads(raw)
            return ToyRecords(str(doc["boot"]), {str(u): tuple(map(str, c)) for u, c in doc["claims"].items()})
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CorruptCheckpointError(f"not a toy checkpoint: {exc}") from exc

    def empty(self, boot_id: str) -> ToyRecords:
        return ToyRecords(boot_id)

    def boot_id(self, value: ToyRecords) -> str:
        return value.boot_id

    def with_boot_id(self, value: ToyRecords, boot_id: str) -> ToyRecords:
        return replace(value, boot_id=boot_id)

    def records(self, value: ToyRecords) -> int:
        return len(value.claims)


class ToyDriver:
    """A `Driver`: prepares a claim allocated `slot-0` of this node by writing its CDI spec."""

    def __init__(
        self, *, node_name: str, plugin_dir: Path, cdi_dir: Path, claims: ClaimSource, boot_id_path: Path
    ) -> None:
        prepare_plugin_dir(plugin_dir)
        self.node_name = node_name
        self.cdi_dir = cdi_dir
        self._claims = claims
        self.store = CheckpointStore(plugin_dir / "checkpoint.json", ToyCodec(), boot_id_path=boot_id_path)
        self._lock = OperationLock(plugin_dir / OPERATION_LOCK_NAME)

    def spec_path(self, uid: str) -> Path:
        return self.cdi_dir / f"{TOY_DRIVER}-claim_{uid}.json"

    def prepare(self, claims: list[ClaimRef]) -> dict[str, PrepareResult]:
        with self._lock.shared(timeout=5.0):
            return {ref.uid: self._prepare(ref) for ref in claims}

    def _prepare(self, ref: ClaimRef) -> PrepareResult:
        done = self.store.load().claims.get(ref.uid)
        if done is not None:  # idempotent: the kubelet may ask again
            return self._result(done)
        try:
            claim = self._claims.get_claim(ref.namespace, ref.name)
        except ApiError as exc:
            return PrepareResult(error=f"reading ResourceClaim {ref.namespace}/{ref.name}: {exc}")
        problem = self._problem(ref, claim)
        if problem:
            return PrepareResult(error=problem)
        cdi_ids = (f"{CDI_KIND}={ref.uid}-{TOY_DEVICE}",)
        self._write_spec(ref.uid)
        self.store.update(lambda r: replace(r, claims={**r.claims, ref.uid: cdi_ids}))
        return self._result(cdi_ids)

    def _problem(self, ref: ClaimRef, claim: JsonObject | None) -> str:
        if claim is None:
            return f"ResourceClaim {ref.namespace}/{ref.name} does not exist"
        if (claim.get("metadata") or {}).get("uid") != ref.uid:
            return f"ResourceClaim {ref.namespace}/{ref.name} has another UID"
        results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
        ours = [r for r in results if r.get("driver") == TOY_DRIVER and r.get("pool") == self.node_name]
        if [r.get("device") for r in ours] != [TOY_DEVICE]:
            return f"ResourceClaim {ref.namespace}/{ref.name} is not allocated {TOY_DEVICE} of {self.node_name}"
        return ""

    def _result(self, cdi_ids: tuple[str, ...]) -> PrepareResult:
        return PrepareResult(devices=(DeviceResult(("slot",), self.node_name, TOY_DEVICE, cdi_ids),))

    def _write_spec(self, uid: str) -> None:
        spec = {
            "cdiVersion": "0.5.0",
            "kind": CDI_KIND,
            "devices": [{"name": f"{uid}-{TOY_DEVICE}", "containerEdits": {"env": [f"TOY_CLAIM_UID={uid}"]}}],
        }
        self.cdi_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.spec_path(uid).with_suffix(".tmp")
        tmp.write_text(json.dumps(spec))
        os.chmod(tmp, 0o644)
        os.replace(tmp, self.spec_path(uid))

    def unprepare(self, claims: list[ClaimRef]) -> dict[str, str]:
        with self._lock.shared(timeout=5.0):
            for ref in claims:
                self.spec_path(ref.uid).unlink(missing_ok=True)
            uids = {ref.uid for ref in claims}
            self.store.update(lambda r: replace(r, claims={u: c for u, c in r.claims.items() if u not in uids}))
            return {ref.uid: "" for ref in claims}

    def close(self) -> None:
        self._lock.close()


def toy_plugin(driver: ToyDriver, *, registry_dir: Path, plugin_dir: Path) -> PluginServer:
    """The toy's kubelet plugin: the layer's server around the driver, with no health stream."""
    return PluginServer(driver_name=TOY_DRIVER, plugin_dir=plugin_dir, registry_dir=registry_dir, driver=driver)
