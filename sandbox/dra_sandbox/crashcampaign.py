"""A randomized crash campaign against the real kubelet plugin: SIGKILL-restart trials with whole GPUs and
dynamic MIG partitions, repeated prepares, and stale unprepare retries mixed, checking the invariants after
every trial.

What a trial does (one of, at random): prepare a new claim on 1-2 free device slots; prepare a prepared claim
again (it must answer with exactly the CDI ids it gave first); unprepare a prepared claim; retry the
unprepare of a claim released earlier (the kubelet does that after a plugin restart, and by then another
claim may hold the same slot, even the same GPU-instance id); or restart the plugin. With probability
`crash_probability` the operation runs in a plugin armed to SIGKILL itself at a crash point that the
operation reaches (`DRA_DRIVER_CRASH_AT`), or is SIGKILLed after a random delay; the plugin is then restarted
and the operation retried until it succeeds, as the kubelet retries.

Invariants (checked after every trial, from the bytes on disk and the fake NVML state):
- every prepared claim: `PrepareCompleted` in the checkpoint with its allocated devices, one CDI spec file
  that parses, and after any restart a repeated prepare reports the same CDI ids;
- every released claim: absent from the checkpoint, no CDI spec file;
- nothing owned twice: no device and no GPU instance in two claims; the live MIG instances are exactly the
  ones the prepared claims' checkpoint records name (same GPU, GI id, profile, placement);
- KEP-5304 device metadata (on: the sandbox reports 1.37): a prepared claim has a metadata file naming its UID and
  a metadata CDI spec per request; a released claim has neither;
- no temporary file left in the plugin directory (its device metadata included) or the CDI directory;
- time-slicing (about half the claims with a whole GPU ask for it): a GPU runs a non-default time-slice only
  for a prepared claim that recorded exactly that interval, and such a claim's GPU runs it;
- passthrough (claims on `gpu-6-vfio` / `gpu-7-vfio`, a VfioDeviceConfig with random IOMMU choices): no PCI
  function is bound to no driver; a prepared passthrough claim's recorded functions are all bound to its vfio
  driver; every other function is bound to the driver it booted with.
At the end every claim is unprepared: then no CDI file, no MIG instance, an empty checkpoint, no temp file,
every GPU at the Default time-slice and compute mode, and every PCI function on its own driver, no override.

    dra-sandbox crash-campaign --trials 1000 --seed 7      (make crash-campaign)
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import shutil
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import grpc

from dra_driver.commands.flags import FlagParser, apply_env_defaults
from dra_driver.nvml.fake.state import FakeNodeState, GpuState, read_fake_state
from dra_driver.nvml.types import ComputeMode, TimeSlice
from dra_driver.plugin.checkpoint import ClaimRecord, ClaimState, decode
from dra_driver.plugin.faults import (
    ENV_VAR,
    METADATA_POINTS,
    MIG_POINTS,
    PREPARE_POINTS,
    UNPREPARE_POINTS,
    VFIO_POINTS,
)
from dra_sandbox.cluster import ClusterConfig, NodeSpec, SandboxCluster
from dra_sandbox.kubelet.draclient import ClaimRef, DraClient
from dra_sandbox.objects import create_allocated_claim

NODE = "crash-node"
# Device slots that never overlap: GPUs 0-3 are carved into two 3g.40gb partitions each (dynamic MIG),
# GPUs 4-7 are handed out whole.
# GPUs 6-7 are also offered for passthrough (`--passthrough`): `gpu-<g>-vfio` excludes `gpu-<g>` (one GPU).
SLOTS: tuple[str, ...] = (
    tuple(f"gpu-{g}-mig-3g40gb-9-{s}" for g in range(4) for s in (0, 4))
    + tuple(f"gpu-{g}" for g in range(4, 8))
    + tuple(f"gpu-{g}-vfio" for g in (6, 7))
)
PASSTHROUGH_GPUS = "6,7"
VFIO_BIND_POINTS = tuple(p for p in VFIO_POINTS if "restore" not in p)
VFIO_RESTORE_POINTS = tuple(p for p in VFIO_POINTS if "restore" in p)
MIG_CREATE_POINTS = tuple(p for p in MIG_POINTS if "destroy" not in p)
MIG_DESTROY_POINTS = tuple(p for p in MIG_POINTS if "destroy" in p)
INTERVALS = ("Default", "Short", "Medium", "Long")
MPS_START_POINTS = ("sharing:after-mps-dirs", "sharing:after-compute-mode", "sharing:after-mps-start")
MPS_STOP_POINTS = ("sharing:after-mps-stop", "sharing:after-compute-mode-reset")
RETRY_LIMIT = 20


# The plugin's retryable refusals while another holder (its own start-up recovery) has the node's claim state.
BUSY_TEXTS: Final = ("recovering the node's claim state", "is in the middle of a claim); try again")
BUSY_RETRY_S: Final = 30.0


def _busy(results: Any) -> bool:
    """True when every claim of a prepare/unprepare answer was refused as busy (nothing was attempted)."""
    if not isinstance(results, Mapping) or not results:
        return False
    errors = [r if isinstance(r, str) or r is None else getattr(r, "error", None) for r in results.values()]
    return all(isinstance(e, str) and any(t in e for t in BUSY_TEXTS) for e in errors)


def _answer_text(results: Any) -> str:
    if not isinstance(results, Mapping):
        return repr(results)
    errors = [r if isinstance(r, str) or r is None else getattr(r, "error", None) for r in results.values()]
    return "; ".join(e for e in errors if e) or "succeeded without reaching it"


@dataclass(frozen=True)
class CampaignSettings:
    trials: int
    seed: int
    crash_probability: float = 0.5


@dataclass
class CampaignReport:
    trials: int = 0
    crashes: int = 0
    restarts: int = 0
    operations: Counter[str] = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)
    unreached: list[str] = field(default_factory=list)  # armed crash points the operation did not reach, and why
    passthrough_claims: int = 0  # claims prepared on a VFIO device
    vfio_crashes: int = 0  # SIGKILLs at a vfio:* point

    def summary(self) -> str:
        ops = ", ".join(f"{k} {v}" for k, v in sorted(self.operations.items()))
        return (
            f"crash campaign: {self.trials} trials, {self.crashes} SIGKILLs ({self.vfio_crashes} at vfio points), "
            f"{self.restarts} restarts; {ops}; {self.passthrough_claims} passthrough claims; "
            f"{len(self.violations)} violations"
        )


@dataclass
class ClaimModel:
    ref: ClaimRef
    devices: tuple[str, ...]
    cdi_ids: tuple[tuple[str, ...], ...] = ()  # per device, as first reported
    time_slice: str | None = None  # TimeSlicing interval of its whole GPUs (a GpuConfig for every request)
    mps: bool = False  # every device shared through one MPS daemon (GpuConfig and MigDeviceConfig MPS)
    vfio: bool = False  # a GPU passed through to a VM


def _gpu_of(slot: str) -> str:
    return slot.split("-mig-")[0].removesuffix("-vfio")


def _clash(a: str, b: str) -> bool:
    """Two slots that cannot be held at once: the same slot, or a GPU's passthrough device and any other use."""
    return a == b or (_gpu_of(a) == _gpu_of(b) and (a.endswith("-vfio") or b.endswith("-vfio")))


class Campaign:
    def __init__(
        self, cluster: SandboxCluster, settings: CampaignSettings, progress: Callable[[str], None] | None = None
    ) -> None:
        self.progress = progress
        self.cluster = cluster
        self.settings = settings
        self.rng = random.Random(settings.seed)  # noqa: S311 - reproducible trials, not security
        self.plugin = cluster.plugins[NODE]
        self.prepared: dict[str, ClaimModel] = {}
        self.released: list[ClaimModel] = []
        self.releasing: list[ClaimModel] = []
        self._seen: set[str] = set()
        self.report = CampaignReport()

    # --- plugin process ---------------------------------------------------------------------------

    def _restart(self, env: dict[str, str] | None = None) -> None:
        self.plugin.kill()
        self.plugin.start(env)
        self.plugin.wait_serving()
        self.report.restarts += 1

    @contextmanager
    def _client(self) -> Iterator[DraClient]:
        channel = grpc.insecure_channel(f"unix://{self.plugin.sockets.dra}")
        try:
            yield DraClient(channel, "v1.DRAPlugin", timeout_s=30)
        finally:
            channel.close()

    def _alive(self) -> bool:
        return self.plugin.process is not None and self.plugin.process.poll() is None

    def _armed(self, points: Sequence[str]) -> str | None:
        """Arm a crash for the next call, or None. Returns a label for the report."""
        if self.rng.random() >= self.settings.crash_probability:
            return None
        if points and self.rng.random() < 0.7:
            point = self.rng.choice(points)
            self._restart({ENV_VAR: point})
            return point
        return "random-delay"

    def _call(self, points: Sequence[str], op: Any) -> bool:
        """Run `op(client)` with a crash armed at random; True when the plugin was killed during it."""
        armed = self._armed(points)
        killer: threading.Timer | None = None
        if armed == "random-delay":
            killer = threading.Timer(self.rng.uniform(0.0, 0.03), self.plugin.kill)
            killer.start()
        with self._client() as client:
            deadline = time.monotonic() + BUSY_RETRY_S
            # A plugin just restarted to arm a point may still be recovering the node's claim state and answer
            # "busy, retry" before reaching any point: ask again, as the kubelet does, so the armed call really runs
            # the operation.
            answer = op(client)
            while _busy(answer) and self._alive() and time.monotonic() < deadline:
                time.sleep(0.05)
                answer = op(client)
        if killer is not None:
            killer.cancel()
            killer.join()
        if not self._alive():
            self.report.crashes += 1
            self.report.vfio_crashes += armed is not None and armed.startswith("vfio:")
            self._restart()
            self._check_reported_again()
            return True
        if armed not in (None, "random-delay"):
            # The point was not reached: say why (a test that expects crashes shows it), then disarm.
            self.report.unreached.append(f"{armed}: {_answer_text(answer)}")
            self._restart()
        return False

    # --- operations -------------------------------------------------------------------------------

    def _free_slots(self) -> list[str]:
        # A claim whose unprepare has not succeeded yet keeps its devices: the scheduler cannot hand them
        # out again before the kubelet has unprepared them (the pod stays terminating until then).
        holders = [*self.prepared.values(), *self.releasing]
        used = {d for c in holders for d in c.devices}
        return [s for s in SLOTS if not any(_clash(s, u) for u in used)]

    def _prepare_until_ok(self, claim: ClaimModel) -> tuple[tuple[str, ...], ...]:
        for _ in range(RETRY_LIMIT):
            with self._client() as client:
                result = client.prepare([claim.ref])[claim.ref.uid]
            if result.ok:
                by_device = {d.device: d.cdi_device_ids for d in result.devices}
                return tuple(by_device.get(d, ()) for d in claim.devices)
            if not self._alive():
                self._restart()
        raise AssertionError(f"prepare of {claim.ref.name} never succeeded: {result.error}")

    def _unprepare_until_ok(self, claim: ClaimModel) -> None:
        error: str | None = None
        for _ in range(RETRY_LIMIT):
            with self._client() as client:
                error = client.unprepare([claim.ref])[claim.ref.uid]
            if error is None:
                return
            if not self._alive():
                self._restart()
        raise AssertionError(f"unprepare of {claim.ref.name} never succeeded: {error}")

    def op_prepare_new(self, near: ClaimModel | None = None) -> None:
        """A new claim on free slots; with `near`, preferably another placement on one of its GPUs (where a
        reused GPU-instance id can be confused with the old claim's)."""
        free = self._free_slots()
        if not free:
            return  # every slot is taken: the next unprepare frees one
        gpus = {d.split("-mig-")[0] for d in near.devices} if near else set()
        close = [s for s in free if s.split("-mig-")[0] in gpus]
        if close and self.rng.random() < 0.8:
            free = close
        devices = tuple(self.rng.sample(free, k=min(len(free), self.rng.choice((1, 1, 2)))))
        if any(d.endswith("-vfio") for d in devices):
            # A passthrough claim holds its VFIO device alone (the plugin refuses a mix); two share no GPU.
            vfio = sorted({d for d in devices if d.endswith("-vfio")})
            devices = tuple(vfio[: self.rng.choice((1, 2))])
            return self._prepare_vfio(devices)
        name = f"cc-{uuid.uuid4().hex[:10]}"
        whole = any("-mig-" not in d for d in devices)
        draw = self.rng.random()
        time_slice = self.rng.choice(INTERVALS) if whole and draw < 0.35 else None
        mps = draw >= 0.65
        stored = create_allocated_claim(
            self.cluster.api,
            namespace="default",
            name=name,
            driver=self.cluster.config.driver_name,
            pool=NODE,
            devices=devices,
            config=self._mps_config() if mps else self._time_slicing_config(time_slice),
        )
        ref = ClaimRef("default", name, stored["metadata"]["uid"])
        claim = ClaimModel(ref, devices, time_slice=time_slice, mps=mps)
        uses_mig = any("-mig-" in d for d in devices)
        points = [*PREPARE_POINTS, *METADATA_POINTS, *(MIG_CREATE_POINTS if uses_mig else ())]
        if time_slice is not None:
            points.append("sharing:after-set-timeslice")
        if mps:
            points += MPS_START_POINTS
        self._call(points, lambda c: c.prepare([claim.ref]))
        claim.cdi_ids = self._prepare_until_ok(claim)
        if any(not ids for ids in claim.cdi_ids):
            self.report.violations.append(f"{name}: a device was reported without CDI ids: {claim.cdi_ids}")
        self.prepared[claim.ref.uid] = claim

    def _prepare_vfio(self, devices: tuple[str, ...]) -> None:
        name = f"cc-vm-{uuid.uuid4().hex[:8]}"
        iommu = {
            "backendPolicy": self.rng.choice(("LegacyOnly", "PreferIommuFD")),
            "enableAPIDevice": self.rng.random() < 0.5,
        }
        parameters = {"apiVersion": "gpu.dra.dev/v1beta1", "kind": "VfioDeviceConfig", "iommu": iommu}
        config = [{"source": "FromClaim", "requests": [],
                   "opaque": {"driver": self.cluster.config.driver_name, "parameters": parameters}}]
        stored = create_allocated_claim(
            self.cluster.api, namespace="default", name=name, driver=self.cluster.config.driver_name, pool=NODE,
            devices=devices, config=config,
        )
        claim = ClaimModel(ClaimRef("default", name, stored["metadata"]["uid"]), devices, vfio=True)
        self._call([*PREPARE_POINTS, *VFIO_BIND_POINTS], lambda c: c.prepare([claim.ref]))
        claim.cdi_ids = self._prepare_until_ok(claim)
        self.prepared[claim.ref.uid] = claim
        self.report.passthrough_claims += 1

    def _time_slicing_config(self, interval: str | None) -> list[Any]:
        """A broad GpuConfig (no requests named): it applies to the whole GPUs, MIG devices stay exclusive."""
        if interval is None:
            return []
        sharing = {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": interval}}
        parameters = {"apiVersion": "gpu.dra.dev/v1beta1", "kind": "GpuConfig", "sharing": sharing}
        return [
            {
                "source": "FromClaim",
                "requests": [],
                "opaque": {"driver": self.cluster.config.driver_name, "parameters": parameters},
            }
        ]

    def _mps_config(self) -> list[Any]:
        """Broad GpuConfig and MigDeviceConfig entries: every device of the claim is served by one MPS daemon."""
        mps = {"defaultActiveThreadPercentage": self.rng.choice((10, 50, 100)), "defaultPinnedDeviceMemoryLimit": "2Gi"}
        return [
            {
                "source": "FromClaim",
                "requests": [],
                "opaque": {
                    "driver": self.cluster.config.driver_name,
                    "parameters": {
                        "apiVersion": "gpu.dra.dev/v1beta1",
                        "kind": kind,
                        "sharing": {"strategy": "MPS", "mpsConfig": mps},
                    },
                },
            }
            for kind in ("GpuConfig", "MigDeviceConfig")
        ]

    def op_prepare_again(self) -> None:
        if not self.prepared:
            return self.op_prepare_new()
        claim = self.prepared[self.rng.choice(sorted(self.prepared))]
        self._call(PREPARE_POINTS, lambda c: c.prepare([claim.ref]))
        self._expect_same(claim, self._prepare_until_ok(claim))

    def op_unprepare(self) -> None:
        if not self.prepared:
            return self.op_prepare_new()
        claim = self.prepared.pop(self.rng.choice(sorted(self.prepared)))
        uses_mig = any("-mig-" in d for d in claim.devices)
        points = [*UNPREPARE_POINTS, *(MIG_DESTROY_POINTS if uses_mig else ())]
        if claim.time_slice is not None:
            points.append("sharing:after-reset-timeslice")
        if claim.mps:
            points += MPS_STOP_POINTS
        if claim.vfio:
            points += VFIO_RESTORE_POINTS
        killed = self._call(points, lambda c: c.unprepare([claim.ref]))
        if killed and self.rng.random() < 0.5:
            # The kubelet may serve another pod before it retries this unprepare: that claim can land on another
            # placement of the same GPU, and NVML may hand it the same GPU-instance id.
            self.releasing.append(claim)
            self.op_prepare_new(near=claim)
            self.releasing.remove(claim)
        self._unprepare_until_ok(claim)
        self.released.append(claim)

    def op_stale_unprepare(self) -> None:
        if not self.released:
            return self.op_unprepare()
        claim = self.rng.choice(self.released)
        self._unprepare_until_ok(claim)

    def op_restart(self) -> None:
        if self.rng.random() < 0.5:
            self.plugin.stop()
            self.plugin.start()
            self.plugin.wait_serving()
            self.report.restarts += 1
        else:
            self.report.crashes += 1
            self._restart()
        self._check_reported_again()

    def _expect_same(self, claim: ClaimModel, cdi_ids: tuple[tuple[str, ...], ...]) -> None:
        if cdi_ids != claim.cdi_ids:
            self.report.violations.append(
                f"{claim.ref.name}: prepared again with other CDI ids: {cdi_ids} (first {claim.cdi_ids})"
            )

    def _check_reported_again(self) -> None:
        """After a restart the kubelet may prepare again: the same devices and CDI ids must come back."""
        for claim in list(self.prepared.values()):
            self._expect_same(claim, self._prepare_until_ok(claim))

    # --- invariants -------------------------------------------------------------------------------

    @property
    def _metadata_dir(self) -> Path:
        return self.plugin.plugin_dir / "dra-device-metadata"

    def _metadata_problems(self, claim: ClaimModel) -> list[str]:
        """KEP-5304 device metadata of a prepared claim (the sandbox reports 1.37: on): one file naming its UID and
        one spec per request (`r<i>`, one per device)."""
        uid, found = claim.ref.uid, []
        for i in range(len(claim.devices)):
            spec = self.cluster.cdi_root / f"{self.cluster.config.driver_name}_metadata_{uid}_r{i}.json"
            file = self._metadata_dir / f"{claim.ref.namespace}_{claim.ref.name}" / f"r{i}" / "metadata.json"
            if not spec.is_file():
                found.append(f"prepared claim {claim.ref.name} has no device metadata spec for r{i}")
            try:
                if json.JSONDecoder().raw_decode(file.read_text())[0]["metadata"]["uid"] != uid:
                    found.append(f"device metadata of {claim.ref.name} r{i} names another claim")
            except (OSError, ValueError, KeyError) as exc:
                found.append(f"device metadata of {claim.ref.name} r{i} is unreadable: {exc}")
        return found

    def check(self, when: str, *, final: bool = False) -> None:
        found: list[str] = []
        path = self.plugin.plugin_dir / "checkpoint.json"
        checkpoint = decode(path.read_bytes()) if path.exists() else None
        claims = dict(checkpoint.claims) if checkpoint is not None else {}
        cdi_root = self.cluster.cdi_root
        for uid, claim in self.prepared.items():
            record = claims.get(uid)
            if record is None or record.state is not ClaimState.PREPARE_COMPLETED:
                found.append(f"prepared claim {claim.ref.name} is {record.state if record else 'missing'}")
            elif tuple(sorted(d.device for d in record.devices)) != tuple(sorted(claim.devices)):
                found.append(f"{claim.ref.name} holds {[d.device for d in record.devices]}, not {claim.devices}")
            specs = list(cdi_root.glob(f"k8s.*-claim_*_{uid}.json"))
            found += self._metadata_problems(claim)
            if len(specs) != 1:
                found.append(f"prepared claim {claim.ref.name} has {len(specs)} CDI spec files")
            else:
                try:
                    json.loads(specs[0].read_text())
                except ValueError as exc:
                    found.append(f"CDI spec of {claim.ref.name} does not parse: {exc}")
        for claim in self.released:
            if claim.ref.uid in claims:
                found.append(f"released claim {claim.ref.name} is still in the checkpoint")
            if list(cdi_root.glob(f"*{claim.ref.uid}*")):
                found.append(f"released claim {claim.ref.name} still has a CDI spec file")
            if (self._metadata_dir / f"{claim.ref.namespace}_{claim.ref.name}").exists():
                found.append(f"released claim {claim.ref.name} still has device metadata")
        extra = set(claims) - set(self.prepared)
        if extra:
            found.append(f"the checkpoint holds claims nobody prepared: {sorted(extra)}")
        owners: Counter[str] = Counter(d.device for r in claims.values() for d in r.devices)
        found += [f"device {d} is held by {n} claims" for d, n in owners.items() if n > 1]
        recorded = Counter(
            (d.mig.parent_uuid, d.mig.gpu_instance_id, d.mig.profile_id, d.mig.placement_start)
            for r in claims.values()
            for d in r.devices
            if d.mig is not None
        )
        found += [f"GPU instance {k} recorded {n} times" for k, n in recorded.items() if n > 1]
        state = read_fake_state(self.plugin.state_file)
        live = Counter((g.uuid, gi.id, gi.profile_id, gi.placement.start) for g in state.gpus for gi in g.gis)
        if live != recorded:
            found.append(f"live MIG instances {sorted(live)} differ from the checkpoint's {sorted(recorded)}")
        found += self._time_slice_problems(list(claims.values()), state.gpus)
        found += self._mps_problems(list(claims.values()), state)
        found += self._pci_problems(list(claims.values()), state, final=final)
        if final:
            found += [
                f"GPU {g.uuid} is left at time-slice {g.time_slice.label}, compute mode {g.compute_mode.name}"
                for g in state.gpus
                if g.time_slice is not TimeSlice.DEFAULT or g.compute_mode is not ComputeMode.DEFAULT
            ]
        temps = [
            p.name for d in (self.plugin.plugin_dir, cdi_root) if d.exists() for p in d.iterdir() if ".tmp" in p.name
        ] + [p.name for p in self._metadata_dir.rglob("*.tmp")]
        if temps:
            found.append(f"temporary files left: {temps}")
        for detail in found:
            if detail not in self._seen:  # a lasting violation is reported once, at the trial that caused it
                self._seen.add(detail)
                self.report.violations.append(f"{when}: {detail}")

    def _mps_problems(self, records: Collection[ClaimRecord], state: FakeNodeState) -> list[str]:
        """Exactly the daemons the records hold run, each with its directory; a GPU is in ExclusiveProcess exactly
        while a record serves it whole through MPS; a prepared MPS claim has every device on its daemon."""
        held = {d.mps.daemon for r in records for d in r.devices if d.mps is not None}
        running = {d.id for d in state.mps_daemons}
        root = self.plugin.plugin_dir / "mps"
        on_disk = {p.name for p in root.iterdir()} if root.is_dir() else set()
        found = []
        if running != held:
            found.append(f"MPS daemons running {sorted(running)}, held by records {sorted(held)}")
        if on_disk != held:
            found.append(f"MPS directories {sorted(on_disk)}, held by records {sorted(held)}")
        exclusive = {
            d.gpu_uuid
            for r in records
            for d in r.devices
            if d.gpu_uuid is not None and d.mps is not None and d.mig is None and "-mig-" not in d.device
        }
        actual = {g.uuid for g in state.gpus if g.compute_mode is ComputeMode.EXCLUSIVE_PROCESS}
        if actual != exclusive:
            found.append(f"GPUs in ExclusiveProcess {sorted(actual)}, MPS holds {sorted(exclusive)}")
        for claim in self.prepared.values():
            record = next((r for r in records if r.uid == claim.ref.uid), None)
            if record is None or not claim.mps:
                continue
            daemons = {d.mps.daemon if d.mps else None for d in record.devices}
            if daemons != {f"claim-{claim.ref.uid}"}:
                found.append(f"{claim.ref.name} asked for MPS, its devices are on daemons {sorted(map(str, daemons))}")
        return found

    def _pci_problems(self, records: Collection[ClaimRecord], state: FakeNodeState, *, final: bool) -> list[str]:
        """No PCI function bound to no driver; a prepared passthrough's functions on its vfio driver; every other
        function on the driver it booted with (at the end: every one, with no driver_override left)."""
        pci = state.pci
        if pci is None:
            return []
        found = [f"PCI function {f.address} is bound to no driver" for f in pci.functions if f.driver is None]
        passed: dict[str, str] = {}
        for record in records:
            for device in record.devices:
                if record.state is ClaimState.PREPARE_COMPLETED and device.vfio is not None:
                    passed.update((f.address, device.vfio.driver) for f in device.vfio.functions)
        for function in pci.functions:
            if function.driver is None:
                continue
            want = passed.get(function.address, function.native_driver)
            if function.driver != want:
                found.append(f"PCI function {function.address} is bound to {function.driver}, not {want}")
            if final and function.driver_override is not None:
                found.append(f"PCI function {function.address} keeps driver_override {function.driver_override}")
        for claim in self.prepared.values():
            held = next((r for r in records if r.uid == claim.ref.uid), None)
            if claim.vfio and held is not None and not all(d.vfio is not None and d.vfio.started
                                                           for d in held.devices):
                found.append(f"passthrough claim {claim.ref.name} is prepared without its functions recorded")
        return found

    def _time_slice_problems(self, records: Collection[ClaimRecord], gpus: Sequence[GpuState]) -> list[str]:
        held = {d.gpu_uuid: d.time_slice for r in records for d in r.devices if d.time_slice is not None}
        found = []
        for gpu in gpus:
            want = held.get(gpu.uuid)
            if want is not None and gpu.time_slice.label != want:
                found.append(f"GPU {gpu.uuid} runs time-slice {gpu.time_slice.label}, its claim recorded {want}")
            if want is None and gpu.time_slice is not TimeSlice.DEFAULT:
                found.append(f"GPU {gpu.uuid} runs time-slice {gpu.time_slice.label} that no prepared claim holds")
        for claim in self.prepared.values():
            record = next((r for r in records if r.uid == claim.ref.uid), None)
            recorded = {d.time_slice for d in record.devices if "-mig-" not in d.device} if record else set()
            if record is not None and claim.time_slice is not None and recorded != {claim.time_slice}:
                found.append(f"{claim.ref.name} asked for time-slice {claim.time_slice}, recorded {recorded}")
        return found

    # --- the run ----------------------------------------------------------------------------------

    def run(self) -> CampaignReport:
        ops = (
            (self.op_prepare_new, 4),
            (self.op_prepare_again, 2),
            (self.op_unprepare, 3),
            (self.op_stale_unprepare, 2),
            (self.op_restart, 1),
        )
        functions = [f for f, _ in ops]
        weights = [w for _, w in ops]
        for trial in range(self.settings.trials):
            op = self.rng.choices(functions, weights)[0]
            name = op.__name__.removeprefix("op_")
            self.report.operations[name] += 1
            try:
                op()
            except AssertionError as exc:  # an operation that never succeeded: the node is stuck, stop here
                self.report.violations.append(f"trial {trial} ({name}): {exc}")
                return self.report
            self.report.trials += 1
            self.check(f"trial {trial} ({name})")
            if self.progress is not None and self.report.trials % 50 == 0:
                self.progress(self.report.summary())
        for claim in list(self.prepared.values()):
            self._unprepare_until_ok(claim)
            self.released.append(self.prepared.pop(claim.ref.uid))
        self.check("after unprepare of all", final=True)
        return self.report


def campaign_node() -> NodeSpec:
    """The campaign's node: dgx-h100 with GPUs 6-7 also offered for passthrough."""
    return NodeSpec(NODE, "fake:dgx-h100", plugin_env={"DRA_DRIVER_PASSTHROUGH": PASSTHROUGH_GPUS})


def run_campaign(
    settings: CampaignSettings, work_dir: Path | None = None, progress: Callable[[str], None] | None = None
) -> CampaignReport:
    work = work_dir or Path(tempfile.mkdtemp(dir="/tmp", prefix="dra-cc-"))
    try:
        config = ClusterConfig(work_dir=work, nodes=[campaign_node()], runtime="cdi-check")
        with SandboxCluster(config) as cluster:
            return Campaign(cluster, settings, progress).run()
    finally:
        if work_dir is None:
            shutil.rmtree(work, ignore_errors=True)


def add_arguments(parser: FlagParser) -> None:
    parser.add_argument("--trials", type=int, default=1000, help="number of random trials")
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: time-based, printed)")
    parser.add_argument("--crash-probability", type=float, default=0.5, help="share of operations that crash")
    apply_env_defaults(parser)


def run(args: argparse.Namespace) -> int:
    from dra_driver.observability.logging import configure_logging

    configure_logging("warning", "text")
    # The kubelet simulator reports every refused connection while the plugin restarts; expected here.
    logging.getLogger("dra_sandbox.kubelet").setLevel(logging.ERROR)
    seed = args.seed if args.seed is not None else int(time.time())
    started = time.monotonic()
    report = run_campaign(
        CampaignSettings(args.trials, seed, args.crash_probability), progress=lambda line: print(line, flush=True)
    )
    for violation in report.violations:
        print(f"VIOLATION {violation}")
    print(f"{report.summary()} (seed {seed}, {time.monotonic() - started:.0f} s)")
    return 1 if report.violations else 0
