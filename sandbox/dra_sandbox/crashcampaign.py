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
- passthrough (`--passthrough-share` of the new claims, on `gpu-4-vfio`..`gpu-7-vfio`, a VfioDeviceConfig with
  random IOMMU choices; GPUs 4 and 5 share an IOMMU group, GPU 6 shares one with a host NIC the plugin may move,
  GPU 7 is VGA-class with an audio and a USB function, GPUs 5-7 run persistence mode; their armed crashes mostly
  land on `vfio:` points, per-function ones as `#n`; after a crashed prepare the pod may go away, and the claim the
  restarted plugin rolled back is unprepared; now and then a claim the scheduler could never allocate, on the
  other GPU of a group in use, must be refused naming the holder; driver reloads come after a plugin restart half
  the time while a VM runs): no PCI function is bound to no driver; no function another claim holds (for containers,
  or in another passthrough's record) is bound to a vfio driver; a prepared passthrough claim's recorded functions
  are all bound to its vfio driver; every other function is bound to the driver it booted with, and a GPU back on
  nvidia has its boot persistence mode; a passed-through GPU is held by no container claim and has no MIG instance,
  MPS daemon or non-default compute mode.
At the end every claim is unprepared: then no CDI file, no MIG instance, an empty checkpoint, no temp file,
every GPU at the Default time-slice and compute mode, and every PCI function on its own driver, no override.

    dra-sandbox crash-campaign --trials 1000 --seed 7      (make crash-campaign)
    dra-sandbox crash-campaign --trials 80 --passthrough-share 0.6 --cd-trials 0     (passthrough in focus)
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from abc import abstractmethod
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TypeVar

from dra_driver.kubeletplugin.claimrecord import decode_checkpoint
from dra_driver.kubeletplugin.metadata import claim_dir_name
from dra_driver.nvml.factory import open_backend
from dra_driver.nvml.fake.backend import FakeNvml
from dra_driver.nvml.fake.pci import PciState
from dra_driver.nvml.fake.state import FakeNodeState, GpuState, read_fake_state
from dra_driver.nvml.types import ComputeMode, GpuInfo, TimeSlice
from dra_driver.pci.model import is_vfio_driver
from dra_driver.plugin.checkpoint import GPU_RECORDS, ClaimRecord, ClaimState, PreparedDevice, VfioRecord
from dra_driver.plugin.faults import (
    ENV_VAR,
    METADATA_POINTS,
    MIG_POINTS,
    PREPARE_POINTS,
    UNPREPARE_POINTS,
    VFIO_POINTS,
)
from dra_sandbox.cluster import NodeSpec, PluginProcess, SandboxCluster
from dra_sandbox.crashtrials import CrashTrials, TrialsReport
from dra_sandbox.kubelet.draclient import ClaimRef
from dra_sandbox.objects import CLAIM_NAME_MAX, claim_name, create_allocated_claim

NODE = "crash-node"
# The node: a DGX H100 whose GPU 7 is a VGA-class card with an audio and a USB function in its IOMMU group.
NODE_FILE: Final = Path(__file__).with_name("crashcampaign-node.yaml")
# Device slots that never overlap: GPUs 0-3 are carved into two 3g.40gb partitions each (dynamic MIG),
# GPUs 4-7 are handed out whole.
# GPUs 4-7 are also offered for passthrough (`--passthrough`): `gpu-<g>-vfio` excludes `gpu-<g>` (one GPU), and
# GPUs 4 and 5 share an IOMMU group, so a VFIO device of either excludes every device of both.
PASSTHROUGH_MINORS: Final = (4, 5, 6, 7)
PERSISTENT_MINORS: Final = (5, 6, 7)  # persistence mode on before the first trial (as nvidia-persistenced leaves it)
# GPUs in one IOMMU group (crashcampaign-node.yaml `pci.groups`).
IOMMU_PEERS: Final = {"gpu-4": "gpu-5", "gpu-5": "gpu-4"}
# Host functions the campaign's plugin may move with a GPU (GPU 6's NIC).
ALLOW_REBIND: Final = "mlx5_core"
VFIO_SLOTS: tuple[str, ...] = tuple(f"gpu-{g}-vfio" for g in PASSTHROUGH_MINORS)
CONTAINER_SLOTS: tuple[str, ...] = tuple(f"gpu-{g}-mig-3g40gb-9-{s}" for g in range(4) for s in (0, 4)) + tuple(
    f"gpu-{g}" for g in range(4, 8)
)
SLOTS: tuple[str, ...] = CONTAINER_SLOTS + VFIO_SLOTS
PASSTHROUGH_GPUS = ",".join(map(str, PASSTHROUGH_MINORS))
# The vfio: points that fire once per PCI function moved (`<point>#<n>`: at the n-th function of the claim).
PER_FUNCTION_POINTS: Final = frozenset(
    ("vfio:after-override", "vfio:after-unbind", "vfio:after-bind",
     "vfio:after-restore-override", "vfio:after-restore-unbind", "vfio:after-restore-bind")
)
PERSISTENCE_POINTS: Final = frozenset(("vfio:after-persistence-off", "vfio:after-persistence-restore"))
# Share of a passthrough claim's armed crashes that land on a vfio: point (the rest: the engine's own points).
VFIO_POINT_SHARE: Final = 0.8
# Share of passthrough claims whose pod goes away after a crashed prepare: the kubelet then unprepares the claim
# the restarted plugin's recovery rolled back, instead of preparing it again.
ABANDON_SHARE: Final = 0.3
VFIO_BIND_POINTS = tuple(p for p in VFIO_POINTS if "restore" not in p)
VFIO_RESTORE_POINTS = tuple(p for p in VFIO_POINTS if "restore" in p)
MIG_CREATE_POINTS = tuple(p for p in MIG_POINTS if "destroy" not in p)
MIG_DESTROY_POINTS = tuple(p for p in MIG_POINTS if "destroy" in p)
INTERVALS = ("Default", "Short", "Medium", "Long")
MPS_START_POINTS = ("sharing:after-mps-dirs", "sharing:after-compute-mode", "sharing:after-mps-start")
MPS_STOP_POINTS = ("sharing:after-mps-stop", "sharing:after-compute-mode-reset")


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


def point_family(point: str) -> str:
    """`vfio:after-bind#2` -> `vfio`; `random-delay` and `restart` stay as they are."""
    return point.split(":", 1)[0]


@dataclass(frozen=True)
class CampaignSettings:
    trials: int
    seed: int
    crash_probability: float = 0.5
    # Share of new claims that are passthrough claims (where a passthrough slot is free); the rest are container
    # claims (MIG, whole GPUs, time-slicing, MPS).
    passthrough_share: float = 0.25
    # Whether trials include NVIDIA driver reloads (unload, load a new version), half of them while a prepare is in
    # flight (plugin/driverreload.py).
    driver_reloads: bool = True
    # Share of new claims named with the longest name Kubernetes accepts: with the namespace, the device-metadata
    # directory and other derived names pass NAME_MAX unless shortened (docs/kubelet-plugin.md "File names from API
    # names").
    long_name_share: float = 0.2


@dataclass
class CampaignReport(TrialsReport):
    unreached: list[str] = field(default_factory=list)  # armed crash points the operation did not reach, and why
    passthrough_claims: int = 0  # claims prepared on a VFIO device
    abandoned: int = 0  # passthrough claims unprepared after a crashed prepare (their pod went away)
    kills: Counter[str] = field(default_factory=Counter)  # SIGKILLs by armed point (`random-delay`, `restart`)
    reloads: int = 0  # NVIDIA driver reloads (unload + load of a new version)
    reloads_in_flight: int = 0  # ... of them while a prepare was in flight
    reloads_after_restart: int = 0  # ... of them right after a plugin restart while a VM ran
    refused_conflicts: int = 0  # claims on a GPU of a group another claim uses, refused as they must be
    lost_claims: int = 0  # prepared MIG claims the plugin reported lost after a reload
    long_named: int = 0  # claims named with the longest name Kubernetes accepts (CLAIM_NAME_MAX)

    @property
    def vfio_crashes(self) -> int:
        """SIGKILLs at a vfio:* point."""
        return self.kills_by_family()["vfio"]

    def kills_by_family(self) -> Counter[str]:
        return Counter({f: sum(n for p, n in self.kills.items() if point_family(p) == f)
                        for f in map(point_family, self.kills)})

    def summary(self) -> str:
        """Every part's line: its title, the trials, SIGKILLs by family, restarts and operations, then what the part
        counts of its own (`detail`)."""
        families = ", ".join(f"{k} {v}" for k, v in sorted(self.kills_by_family().items()))
        return (
            f"{self.title()}: {self.trials} trials, {self.crashes} SIGKILLs ({families}), {self.restarts} restarts; "
            f"{self.operations_line()}; {self.detail()}; {self.long_named} claims with {CLAIM_NAME_MAX}-byte names; "
            f"{len(self.violations)} violations"
        )

    def title(self) -> str:
        return "crash campaign"

    def detail(self) -> str:
        return (
            f"{self.passthrough_claims} passthrough claims ({self.abandoned} abandoned after a crash, "
            f"{self.refused_conflicts} group conflicts refused); {self.reloads} driver reloads "
            f"({self.reloads_in_flight} during a prepare, {self.reloads_after_restart} after a restart with a VM "
            f"running, {self.lost_claims} MIG claims reported lost)"
        )

    def family_detail(self, family: str) -> str:
        """The SIGKILLs at one family's points (`vfio`, `vgpu` ...), point by point (`#n`: at the n-th PCI function,
        vGPU or partition GPU of the claim)."""
        return ", ".join(f"{p} {n}" for p, n in sorted(self.kills.items()) if point_family(p) == family) or "none"


@dataclass
class ClaimModel:
    ref: ClaimRef
    devices: tuple[str, ...]
    cdi_ids: tuple[tuple[str, ...], ...] = ()  # per device, as first reported
    time_slice: str | None = None  # TimeSlicing interval of its whole GPUs (a GpuConfig for every request)
    mps: bool = False  # every device shared through one MPS daemon (GpuConfig and MigDeviceConfig MPS)
    vfio: bool = False  # handed to a VM (a GPU passed through, or a Fabric Manager partition)


def _gpu_of(slot: str) -> str:
    return slot.split("-mig-")[0].removesuffix("-vfio")


def _clash(a: str, b: str) -> bool:
    """Two slots that cannot be held at once: the same slot, or a passthrough device and any other use of its GPU or
    of another GPU of its IOMMU group (as the slices' counters make the scheduler decide)."""
    if a == b:
        return True
    same_group = _gpu_of(a) == _gpu_of(b) or IOMMU_PEERS.get(_gpu_of(a)) == _gpu_of(b)
    return same_group and (a.endswith("-vfio") or b.endswith("-vfio"))


ReportT = TypeVar("ReportT", bound=CampaignReport)


def vm_gpus(device: PreparedDevice) -> tuple[VfioRecord, ...]:
    """The GPUs a device hands to a VM: a single passthrough's GPU, or every member of a Fabric Manager partition."""
    if device.vfio is not None:
        return (device.vfio,)
    return device.fm_partition.gpus if device.fm_partition is not None else ()


class NodeCampaign(CrashTrials[ClaimModel, ReportT]):
    """What every part of the campaign on one node of the GPU plugin shares, whatever its device kind: arming a
    crash and the kubelet's retries, restarts, the kubelet serving another pod before it retries a crashed unprepare,
    repeated and stale calls, and the checks of claims, device metadata, temp files and PCI bindings. A part says
    which new claims it makes (`op_prepare_new`), which points its unprepare reaches, and what its kind must hold
    (`_kind_problems`)."""

    # The family of the part's own crash points (vfio, vgpu ...), which the report lists point by point, and the share
    # of an armed crash drawn from the operation's own points of it (its focus), where it has them; the rest from the
    # engine's points.
    family: str
    focus_share: float = 0.8

    def __init__(self, cluster: SandboxCluster, node: str, settings: CampaignSettings, report: ReportT,
                 progress: Callable[[str], None] | None = None) -> None:
        self.plugin: PluginProcess = cluster.plugins[node]
        super().__init__(self.plugin, report, settings.seed, settings.trials, progress)
        self.cluster = cluster
        self.node = node
        self.settings = settings
        self.releasing: list[ClaimModel] = []
        # PCI functions someone else bound to a driver of their choice (a foreign VM's GPU): address -> driver.
        self.bound_elsewhere: dict[str, str] = {}
        self.gpu_address: dict[str, str] = {}
        self.boot_persistence: dict[str, bool] = {}
        # Per device handed to a VM: how many PCI functions its prepare moves, and whether a GPU of it runs
        # persistence mode (which vfio: points it reaches).
        self.functions_moved: dict[str, int] = {}
        self.slot_persistent: dict[str, bool] = {}

    def _read_gpus(self, persistent: Collection[int] = ()) -> dict[int, GpuInfo]:
        """Persistence mode on for the `persistent` minors (as nvidia-persistenced leaves a host), then what the PCI
        checks need: each GPU's PCI address and boot persistence mode. The GPUs by minor."""
        nvml = open_backend(self.plugin.nvml_spec, driver_root="/")
        nvml.init()
        try:
            gpus = {g.minor: g for g in nvml.gpus()}
            for minor in persistent:
                nvml.set_persistence_mode(gpus[minor].uuid, True)
            self.gpu_address = {g.uuid: g.pci_bus_id.lower() for g in gpus.values()}
            self.boot_persistence = {g.uuid: nvml.persistence_mode(g.uuid) for g in gpus.values()}
        finally:
            nvml.shutdown()
        return gpus

    # --- plugin process ---------------------------------------------------------------------------

    def _restart(self, env: dict[str, str] | None = None) -> None:
        self.plugin.kill()
        self.plugin.start(env)
        self.plugin.wait_serving()
        self.report.restarts += 1

    def _alive(self) -> bool:
        return self.plugin.process is not None and self.plugin.process.poll() is None

    def _exits(self, timeout_s: float = 5.0) -> bool:
        """True when the plugin exits within `timeout_s`: a SIGKILLed process closes its sockets before it can be
        reaped, so a call may see the connection drop while poll() still finds it running."""
        process = self.plugin.process
        if process is None:
            return True
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return False
        return True

    def _armed(self, points: Sequence[str], focus: Sequence[str] = ()) -> str | None:
        """Arm a crash for the next call, or None. Returns a label for the report. With `focus` (a passthrough
        claim's vfio: points), VFIO_POINT_SHARE of the armed points are drawn from it."""
        if self.rng.random() >= self.settings.crash_probability:
            return None
        if (points or focus) and self.rng.random() < 0.7:
            point = self.rng.choice(focus if focus and (not points or self.rng.random() < self.focus_share) else points)
            self._restart({ENV_VAR: point})
            return point
        return "random-delay"

    def _vfio_points(self, devices: Sequence[str], points: Sequence[str]) -> list[str]:
        """The vfio: points a prepare or unprepare of these devices (passed to a VM) reaches: per-function points as
        `<point>#<n>` for every function the claim moves, persistence points only where a GPU had it on
        (`functions_moved`, `slot_persistent`)."""
        functions = sum(self.functions_moved[d] for d in devices)
        persistent = any(self.slot_persistent[d] for d in devices)
        found: list[str] = []
        for point in points:
            if point in PER_FUNCTION_POINTS:
                found += [point if n == 1 else f"{point}#{n}" for n in range(1, functions + 1)]
            elif point not in PERSISTENCE_POINTS or persistent:
                found.append(point)
        return found

    def _call(self, points: Sequence[str], op: Any, focus: Sequence[str] = ()) -> str | None:
        """Run `op(client)` with a crash armed at random; the armed point (`unarmed` if none) when the plugin was
        killed during it, else None."""
        armed = self._armed(points, focus)
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
        if not self._alive() or (armed is not None and "UNAVAILABLE" in _answer_text(answer) and self._exits()):
            self.report.crashes += 1
            self.report.kills[armed or "unarmed"] += 1
            if armed is None:
                self.report.violations.append(f"the plugin died with no crash armed (log: {self.plugin.log_file})")
            self._restart()
            self._check_reported_again()
            return armed or "unarmed"
        if armed not in (None, "random-delay"):
            # The point was not reached: say why (a test that expects crashes shows it), then disarm.
            self.report.unreached.append(f"{armed}: {_answer_text(answer)}")
            self._restart()
        return None

    # --- operations -------------------------------------------------------------------------------

    @abstractmethod
    def op_prepare_new(self, near: ClaimModel | None = None) -> None:
        """A new claim of the part's kind; with `near`, preferably on a GPU of that claim (released, not yet
        unprepared): where a reused id (GPU instance, VF, partition) can be confused with the old claim's."""

    def _prepare_until_ok(self, claim: ClaimModel) -> tuple[tuple[str, ...], ...]:
        by_device = {d.device: d.cdi_device_ids for d in self._prepared(claim).devices}
        return tuple(by_device.get(d, ()) for d in claim.devices)

    def _claim_name(self, prefix: str) -> str:
        name = claim_name(prefix, self.rng, self.settings.long_name_share)
        self.report.long_named += len(name) == CLAIM_NAME_MAX
        return name

    def _new_claim(self, devices: Sequence[str], prefix: str, config: Sequence[Any] = (), *,
                   vfio: bool = False) -> ClaimModel:  # fmt: skip
        """A claim named `<prefix>-…` allocated to these devices of the node, as the scheduler writes it."""
        name = self._claim_name(prefix)
        stored = create_allocated_claim(self.cluster.api, namespace="default", name=name,
                                        driver=self.cluster.config.driver_name, pool=self.node, devices=devices,
                                        config=config)  # fmt: skip
        return ClaimModel(ClaimRef("default", name, stored["metadata"]["uid"]), tuple(devices), vfio=vfio)

    def _expect_refused(self, claim: ClaimModel, why: str) -> None:
        """A claim the scheduler could never allocate (a stale allocation; `why`): its prepare must be refused and
        change nothing (the checks), then its pod goes (the kubelet unprepares it)."""
        with self._client() as client:
            result = client.prepare([claim.ref])[claim.ref.uid]
        if result.ok:
            self.report.violations.append(f"{claim.ref.name} on {', '.join(claim.devices)}, {why}, was prepared; "
                                          "expected a refusal")  # fmt: skip
        else:
            self.report.refused_conflicts += 1
        self._unprepare_until_ok(claim)
        self.released.append(claim)

    def _vfio_config(self) -> list[Any]:
        iommu = {
            "backendPolicy": self.rng.choice(("LegacyOnly", "PreferIommuFD")),
            "enableAPIDevice": self.rng.random() < 0.5,
        }
        parameters = {"apiVersion": "gpu.dra.dev/v1beta1", "kind": "VfioDeviceConfig", "iommu": iommu}
        return [{"source": "FromClaim", "requests": [],
                 "opaque": {"driver": self.cluster.config.driver_name, "parameters": parameters}}]

    def op_prepare_again(self) -> None:
        if not self.prepared:
            return self.op_prepare_new()
        claim = self.prepared[self.rng.choice(sorted(self.prepared))]
        self._call(PREPARE_POINTS, lambda c: c.prepare([claim.ref]))
        self._expect_same(claim, self._prepare_until_ok(claim))

    def op_unprepare(self) -> None:
        if not self.prepared:
            return self.op_prepare_new()
        self._unprepare(self.prepared.pop(self.rng.choice(sorted(self.prepared))))

    def _prepare_or_abandon(self, claim: ClaimModel, focus: Sequence[str]) -> None:
        """Prepare a new claim with a crash armed at random, as the kubelet does; after a crash, ABANDON_SHARE of the
        time its pod goes away instead of the prepare being retried (`_abandon`)."""
        killed = self._call([*PREPARE_POINTS, *METADATA_POINTS], lambda c: c.prepare([claim.ref]), focus)
        if killed and self.rng.random() < ABANDON_SHARE:
            self._abandon(claim, killed)
            self.released.append(claim)
            self.report.abandoned += 1
            return
        claim.cdi_ids = self._prepare_until_ok(claim)
        self.prepared[claim.ref.uid] = claim

    def _abandon(self, claim: ClaimModel, killed_at: str) -> None:
        """The pod of a claim whose prepare crashed (at `killed_at`) went away: the kubelet unprepares what it tried,
        and the checks see what the restarted plugin rolled back (for a VM: its GPUs on nvidia, persistence mode as
        before, no record)."""
        self._unprepare_until_ok(claim)

    def _unprepare_points(self, claim: ClaimModel) -> list[str]:
        """The points an unprepare of `claim` reaches (the engine's; a part adds its kind's)."""
        return list(UNPREPARE_POINTS)

    def _unprepare_focus(self, claim: ClaimModel) -> list[str]:
        """The part's own points an unprepare of `claim` reaches, drawn from first (`focus_share`)."""
        return []

    def _unprepare(self, claim: ClaimModel) -> None:
        killed = self._call(self._unprepare_points(claim), lambda c: c.unprepare([claim.ref]),
                            self._unprepare_focus(claim))  # fmt: skip
        if killed and self.rng.random() < 0.5:
            # The kubelet may serve another pod before it retries this unprepare: that claim can land on the same
            # GPU and be handed the same id (a GPU instance, a VF, a partition).
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
        if self._restart_gracefully_or_crash():
            self.report.kills["restart"] += 1
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

    def _claim_metadata_dir(self, claim: ClaimModel) -> Path:
        """`<namespace>_<claim>`, the claim name shortened to fit NAME_MAX (docs/kubelet-plugin.md "File names from
        API names"); `_metadata_problems` proves the directory holds this claim's metadata."""
        return self._metadata_dir / claim_dir_name(claim.ref.namespace, claim.ref.name)

    def _metadata_problems(self, claim: ClaimModel) -> list[str]:
        """KEP-5304 device metadata of a prepared claim (the sandbox reports 1.37: on): one file naming its UID and
        one spec per request (`r<i>`, one per device)."""
        uid, found = claim.ref.uid, []
        claim_dir = self._claim_metadata_dir(claim)
        for i in range(len(claim.devices)):
            spec = self.cluster.cdi_root / f"{self.cluster.config.driver_name}_metadata_{uid}_r{i}.json"
            file = claim_dir / f"r{i}" / "metadata.json"
            if not spec.is_file():
                found.append(f"prepared claim {claim.ref.name} has no device metadata spec for r{i}")
            try:
                if json.JSONDecoder().raw_decode(file.read_text())[0]["metadata"]["uid"] != uid:
                    found.append(f"device metadata of {claim.ref.name} r{i} names another claim")
            except (OSError, ValueError, KeyError) as exc:
                found.append(f"device metadata of {claim.ref.name} r{i} is unreadable: {exc}")
        return found

    def _recorded_claims(self) -> dict[str, ClaimRecord]:
        """The claims of the plugin's checkpoint on disk, by UID."""
        path = self.plugin.plugin_dir / "checkpoint.json"
        checkpoint = decode_checkpoint(path.read_bytes(), GPU_RECORDS) if path.exists() else None
        return dict(checkpoint.claims) if checkpoint is not None else {}

    def _claim_problems(self, claims: Mapping[str, ClaimRecord]) -> list[str]:
        """What every device kind's claims must hold: a prepared claim completed with its devices, one CDI spec that
        parses and its device metadata; a released one gone from the checkpoint, CDI and metadata; no claim nobody
        prepared."""
        found: list[str] = []
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
            if self._claim_metadata_dir(claim).exists():
                found.append(f"released claim {claim.ref.name} still has device metadata")
        extra = set(claims) - set(self.prepared)
        if extra:
            found.append(f"the checkpoint holds claims nobody prepared: {sorted(extra)}")
        return found

    def _temporary_files(self) -> list[str]:
        temps = [
            p.name
            for d in (self.plugin.plugin_dir, self.cluster.cdi_root)
            if d.exists()
            for p in d.iterdir()
            if ".tmp" in p.name
        ] + [p.name for p in self._metadata_dir.rglob("*.tmp")]
        return [f"temporary files left: {temps}"] if temps else []

    def check(self, when: str, *, final: bool = False) -> None:
        claims = self._recorded_claims()
        found = self._claim_problems(claims) + self._kind_problems(claims, final=final) + self._temporary_files()
        self.report_new(when, found)

    @abstractmethod
    def _kind_problems(self, claims: Mapping[str, ClaimRecord], *, final: bool) -> list[str]:
        """What the part's device kind must hold now (`final`: every claim unprepared)."""

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
                if record.state is ClaimState.PREPARE_COMPLETED:
                    passed.update((f.address, gpu.driver) for gpu in vm_gpus(device) for f in gpu.functions)
        found += self._held_function_problems(records, pci)
        for function in pci.functions:
            if function.driver is None:
                continue
            want = passed.get(function.address) or self.bound_elsewhere.get(function.address, function.native_driver)
            if function.driver != want:
                found.append(f"PCI function {function.address} is bound to {function.driver}, not {want}")
            if final and function.driver_override is not None and function.address not in self.bound_elsewhere:
                found.append(f"PCI function {function.address} keeps driver_override {function.driver_override}")
        by_uid = {r.uid: r for r in records}
        for claim in self.prepared.values():
            held = by_uid.get(claim.ref.uid)
            recorded = held is not None and all(vm_gpus(d) and all(g.started for g in vm_gpus(d)) for d in held.devices)
            if claim.vfio and held is not None and not recorded:
                found.append(f"passthrough claim {claim.ref.name} is prepared without its functions recorded")
        return found + self._passthrough_gpu_problems(records, state, set(passed))

    def _held_function_problems(self, records: Collection[ClaimRecord], pci: PciState) -> list[str]:
        """No PCI function that another claim holds is bound to a vfio driver: no GPU a container claim's record
        (in any state) holds, and no function two passthrough records name."""
        containers: dict[str, str] = {}
        recorded: dict[str, set[str]] = {}
        for record in records:
            for device in (*record.devices, *record.allocated):
                if vm_gpus(device):
                    for moved in (f for gpu in vm_gpus(device) for f in gpu.functions):
                        recorded.setdefault(moved.address, set()).add(record.name)
                elif device.gpu_uuid is not None and device.gpu_uuid in self.gpu_address:
                    containers[self.gpu_address[device.gpu_uuid]] = record.name
        found = []
        for function in pci.functions:
            if not is_vfio_driver(function.driver):
                continue
            if function.address in containers:
                found.append(f"PCI function {function.address} is bound to {function.driver} while container claim "
                             f"{containers[function.address]} holds it")
            if len(recorded.get(function.address, ())) > 1:
                found.append(f"PCI function {function.address} is recorded by passthrough claims "
                             f"{sorted(recorded[function.address])}")
        return found

    def _passthrough_gpu_problems(
        self, records: Collection[ClaimRecord], state: FakeNodeState, passed: set[str]
    ) -> list[str]:
        """A GPU no prepared passthrough holds (never passed through, rolled back, or unprepared) is on nvidia with
        its boot persistence mode; a passed-through GPU is held by no container claim, and carries no MIG instance,
        MPS daemon or exclusive compute mode."""
        assert state.pci is not None
        found = []
        vfio_gpus = {g.address: r.name for r in records for d in r.devices for g in vm_gpus(d)}
        container = {
            self.gpu_address.get(d.gpu_uuid): r.name
            for r in records
            for d in r.devices
            if not vm_gpus(d) and d.gpu_uuid is not None
        }
        for address, vm_claim in vfio_gpus.items():
            if address in container:
                found.append(f"GPU {address} is passed through by {vm_claim} and also held by {container[address]}")
        mps_gpus = {u for d in state.mps_daemons for u in d.visible_uuids}
        for gpu in state.gpus:
            address = self.gpu_address[gpu.uuid]
            driver = state.pci.driver_of(address)
            if address not in passed:
                if driver == "nvidia" and gpu.persistence_mode != self.boot_persistence[gpu.uuid]:
                    found.append(
                        f"GPU {address} is back on nvidia with persistence mode {gpu.persistence_mode}, booted with "
                        f"{self.boot_persistence[gpu.uuid]}"
                    )
                continue
            if gpu.gis or gpu.uuid in mps_gpus or gpu.compute_mode is not ComputeMode.DEFAULT:
                found.append(f"passed-through GPU {address} carries MIG instances, an MPS daemon or a compute mode")
        return found

    # --- the run ----------------------------------------------------------------------------------

    def operations(self) -> Sequence[tuple[Callable[[], None], int]]:
        return (
            (self.op_prepare_new, 4),
            (self.op_prepare_again, 2),
            (self.op_unprepare, 3),
            (self.op_stale_unprepare, 2),
            (self.op_restart, 1),
            *self.kind_operations(),
        )

    def kind_operations(self) -> Sequence[tuple[Callable[[], None], int]]:
        """The part's own operations beside the shared ones, with their weights."""
        return ()

    def final_check(self) -> None:
        self.check("after unprepare of all", final=True)

class Campaign(NodeCampaign[CampaignReport]):
    """The GPU plugin's node (crashcampaign-node.yaml): dynamic MIG, whole GPUs with time-slicing or MPS, passthrough,
    driver reloads and stale allocations on a shared IOMMU group."""

    family = "vfio"
    focus_share = VFIO_POINT_SHARE

    def __init__(
        self, cluster: SandboxCluster, settings: CampaignSettings, progress: Callable[[str], None] | None = None
    ) -> None:
        super().__init__(cluster, NODE, settings, CampaignReport(), progress)
        self._node_setup()

    def _node_setup(self) -> None:
        """What the checks and the per-function crash points need: the GPUs' addresses and boot persistence mode
        (PERSISTENT_MINORS on), and how many functions a passthrough of each VFIO slot moves (the functions of its
        IOMMU group bound to a driver)."""
        gpus = self._read_gpus(PERSISTENT_MINORS)

        pci = read_fake_state(self.plugin.state_file).pci
        if pci is None:
            raise RuntimeError(f"the campaign node {NODE_FILE} has no PCI state")
        for slot in VFIO_SLOTS:
            gpu = gpus[int(_gpu_of(slot).removeprefix("gpu-"))]
            group = pci.function(self.gpu_address[gpu.uuid]).iommu_group
            self.functions_moved[slot] = sum(1 for f in pci.functions if f.iommu_group == group and f.driver)
            self.slot_persistent[slot] = self.boot_persistence[gpu.uuid]

    # --- operations -------------------------------------------------------------------------------

    def _free_slots(self) -> list[str]:
        # A claim whose unprepare has not succeeded yet keeps its devices: the scheduler cannot hand them
        # out again before the kubelet has unprepared them (the pod stays terminating until then).
        holders = [*self.prepared.values(), *self.releasing]
        used = {d for c in holders for d in c.devices}
        return [s for s in SLOTS if not any(_clash(s, u) for u in used)]

    def op_prepare_new(self, near: ClaimModel | None = None) -> None:
        """A new claim on free slots; with `near`, preferably another placement on one of its GPUs (where a
        reused GPU-instance id can be confused with the old claim's)."""
        free = self._free_slots()
        free_vfio = [s for s in free if s in VFIO_SLOTS]
        wants_vm = self.rng.random() < self.settings.passthrough_share
        vms = sorted(u for u, c in self.prepared.items() if c.vfio)
        if wants_vm and not free_vfio and vms and near is None:
            # Every passthrough GPU is taken: a running VM ends first (else the few passthrough slots stay taken
            # and the share is not met).
            self._unprepare(self.prepared.pop(self.rng.choice(vms)))
            free = self._free_slots()
            free_vfio = [s for s in free if s in VFIO_SLOTS]
        if free_vfio and wants_vm:
            # A passthrough claim holds VFIO devices only (the plugin refuses a mix); two share no GPU or group.
            first = self.rng.choice(free_vfio)
            rest = [s for s in free_vfio if not _clash(s, first)]
            picked = [first, self.rng.choice(rest)] if rest and self.rng.random() < 1 / 3 else [first]
            return self._prepare_vfio(tuple(sorted(picked)))
        free = [s for s in free if s not in VFIO_SLOTS]
        if not free:
            return  # every slot is taken: the next unprepare frees one
        gpus = {_gpu_of(d) for d in near.devices} if near else set()
        close = [s for s in free if _gpu_of(s) in gpus]
        if close and self.rng.random() < 0.8:
            free = close
        devices = tuple(self.rng.sample(free, k=min(len(free), self.rng.choice((1, 1, 2)))))
        name = self._claim_name("cc")
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
        name = self._claim_name("cc-vm")
        config = self._vfio_config()
        stored = create_allocated_claim(
            self.cluster.api, namespace="default", name=name, driver=self.cluster.config.driver_name, pool=NODE,
            devices=devices, config=config,
        )
        claim = ClaimModel(ClaimRef("default", name, stored["metadata"]["uid"]), devices, vfio=True)
        self.report.passthrough_claims += 1
        self._prepare_or_abandon(claim, self._vfio_points(devices, VFIO_BIND_POINTS))

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

    def op_conflict(self) -> None:
        """A claim the scheduler could never allocate (a stale allocation): a VFIO device of a GPU whose IOMMU group
        another claim uses, or a container device of a GPU in a passed-through group. The plugin must refuse it,
        naming the holder, and change nothing; then its pod goes (the kubelet unprepares it)."""
        held = {d: c for c in self.prepared.values() for d in c.devices if _gpu_of(d) in IOMMU_PEERS}
        if not held:
            return self.op_prepare_new()
        device, holder = sorted(held.items())[self.rng.randrange(len(held))]
        peer = IOMMU_PEERS[_gpu_of(device)]
        slot = f"{peer}-vfio" if not holder.vfio or self.rng.random() < 0.5 else peer
        name = self._claim_name("cc-stale")
        config = self._vfio_config() if slot.endswith("-vfio") else []
        stored = create_allocated_claim(self.cluster.api, namespace="default", name=name,
                                        driver=self.cluster.config.driver_name, pool=NODE, devices=(slot,),
                                        config=config)
        claim = ClaimModel(ClaimRef("default", name, stored["metadata"]["uid"]), (slot,), vfio=slot.endswith("-vfio"))
        with self._client() as client:
            result = client.prepare([claim.ref])[claim.ref.uid]
        error = result.error or ""
        # Every prepared claim whose devices clash with the slot may be the one named (the slot's own GPU can be held
        # too). A plugin restarted while the group is on vfio-pci has never read its GPUs (docs/passthrough.md): it
        # refuses a device of theirs as not offered.
        holders = [c for c in self.prepared.values() if any(_clash(slot, d) for d in c.devices)]
        named = any(f"default/{c.ref.name} " in error for c in holders)
        unread = any(c.vfio for c in holders) and "is not offered by pool" in error
        if result.ok or not (named or unread):
            self.report.violations.append(
                f"{name} on {slot} beside {holder.ref.name} on {device} (one IOMMU group) was answered "
                f"{error or 'ok'!r}; expected a refusal naming the holder"
            )
        else:
            self.report.refused_conflicts += 1
        self._unprepare_until_ok(claim)
        self.released.append(claim)

    def _unprepare_points(self, claim: ClaimModel) -> list[str]:
        uses_mig = any("-mig-" in d for d in claim.devices)
        points = [*UNPREPARE_POINTS, *(MIG_DESTROY_POINTS if uses_mig else ())]
        if claim.time_slice is not None:
            points.append("sharing:after-reset-timeslice")
        if claim.mps:
            points += MPS_STOP_POINTS
        return points

    def _unprepare_focus(self, claim: ClaimModel) -> list[str]:
        return self._vfio_points(claim.devices, VFIO_RESTORE_POINTS) if claim.vfio else []

    # --- NVIDIA driver reloads ---------------------------------------------------------------------

    def op_driver_reload(self, during_prepare: bool | None = None) -> None:
        """`rmmod nvidia; modprobe nvidia` of a new version under the running plugin (the GPU Operator's driver
        upgrade), half the time while a new claim's prepare is in flight. Afterwards: the slices carry the new
        driverVersion, every claim holding a MIG device answers its prepare with the "lost" error (its instance went
        with the driver) and is unprepared (its pod goes), every other claim is prepared again with the same CDI ids
        (its time-slice or MPS daemon re-applied), and the invariants hold. `during_prepare`: None draws it."""
        if not self.settings.driver_reloads:
            return self.op_prepare_again()
        if any(c.vfio for c in self.prepared.values()) and self.rng.random() < 0.5:
            # A plugin restarted while a GPU is on vfio-pci has never read it from NVML: the reload must still find
            # the VM's claim by its binding (issue 36 #4).
            self.report.reloads_after_restart += 1
            self.plugin.stop()
            self.plugin.start()
            self.plugin.wait_serving()
            self.report.restarts += 1
        self.report.reloads += 1
        version = f"580.{200 + self.report.reloads}.1"  # as published (semver: no leading zeros)
        admin = open_backend(self.plugin.nvml_spec, driver_root="/")
        if not isinstance(admin, FakeNvml):
            raise RuntimeError("the campaign's node is a fake NVML node")
        admin.init()
        free = [s for s in self._free_slots() if s not in VFIO_SLOTS]
        in_flight: ClaimModel | None = None
        answer: dict[str, Any] = {}
        worker: threading.Thread | None = None
        if during_prepare is None:
            during_prepare = self.rng.random() < 0.5
        if free and during_prepare:
            self.report.reloads_in_flight += 1
            devices = (self.rng.choice(free),)
            name = self._claim_name("cc-rl")
            stored = create_allocated_claim(self.cluster.api, namespace="default", name=name,
                                            driver=self.cluster.config.driver_name, pool=NODE, devices=devices)
            in_flight = ClaimModel(ClaimRef("default", name, stored["metadata"]["uid"]), devices)
            ref = in_flight.ref

            def prepare() -> None:
                with self._client() as client:
                    answer.update(client.prepare([ref]))

            worker = threading.Thread(target=prepare, name="in-flight-prepare")
            worker.start()
            time.sleep(self.rng.uniform(0.0, 0.03))  # the fault's timing (as the random-delay kill), not a wait
        admin.unload_driver()
        admin.load_driver(version)
        if worker is not None:
            worker.join()
        self._wait_reloaded(version)
        self._persistence_after_reload(admin)
        for claim in [c for c in self.prepared.values() if any("-mig-" in d for d in c.devices)]:
            self._expect_lost(claim)
        if in_flight is not None:
            with self._client() as client:
                result = client.prepare([in_flight.ref])[in_flight.ref.uid]
            if result.ok or "did not survive the NVIDIA driver reload" not in (result.error or ""):
                in_flight.cdi_ids = self._prepare_until_ok(in_flight)  # failed or refused meanwhile: retried
                self.prepared[in_flight.ref.uid] = in_flight
            else:
                self.report.lost_claims += 1  # prepared before the reload: a MIG instance of the old driver
                self._unprepare_until_ok(in_flight)
                self.released.append(in_flight)
        self._check_reported_again()

    def _wait_reloaded(self, version: str) -> None:
        """Until the slices carry the new driverVersion and no device the unmonitored taint (removed once the
        plugin serves the new driver)."""
        deadline = time.monotonic() + 60.0
        while time.monotonic() < deadline:
            slices = self.cluster.api.request("GET", "/apis/resource.k8s.io/v1/resourceslices")["items"]
            devices = [d for s in slices for d in s["spec"].get("devices", [])]
            versions = {((d.get("attributes") or {}).get("driverVersion") or {}).get("version") for d in devices}
            tainted = any(t.get("key", "").endswith("/unmonitored") for d in devices for t in d.get("taints", []))
            if devices and versions - {None} == {version} and not tainted:  # VFIO devices carry no driverVersion
                return
            time.sleep(0.1)
        tail = self.plugin.log_file.read_text(errors="replace")[-3000:] if self.plugin.log_file.exists() else ""
        raise AssertionError(f"the plugin did not serve the reloaded driver {version} within 60 s "
                             f"(log: {self.plugin.log_file}):\n{tail}")

    def _persistence_after_reload(self, admin: FakeNvml) -> None:
        """nvidia-persistenced turns persistence mode on again once the new driver is up (the GPU Operator's driver
        container runs it); GPUs on vfio-pci are not NVML's and get theirs back when a VM's claim ends."""
        admin.shutdown()  # its session is the old driver's
        admin.init()
        try:
            for gpu in admin.gpus():
                if gpu.minor in PERSISTENT_MINORS:
                    admin.set_persistence_mode(gpu.uuid, True)
        finally:
            admin.shutdown()

    def _expect_lost(self, claim: ClaimModel) -> None:
        """A claim holding a MIG device after a reload: its prepare fails naming the device, its record is kept (and
        marked) until the pod goes."""
        with self._client() as client:
            result = client.prepare([claim.ref])[claim.ref.uid]
        if result.ok or "did not survive the NVIDIA driver reload" not in (result.error or ""):
            self.report.violations.append(
                f"{claim.ref.name} holds a MIG device across a driver reload but its prepare answered "
                f"{result.error or 'ok'!r} (expected the lost-claim error)"
            )
        path = self.plugin.plugin_dir / "checkpoint.json"
        record = decode_checkpoint(path.read_bytes(), GPU_RECORDS).claims.get(claim.ref.uid) if path.exists() else None
        if record is None or record.lost is None:
            self.report.violations.append(f"{claim.ref.name}: lost in the reload but its record is not marked lost")
        self.report.lost_claims += 1
        self.prepared.pop(claim.ref.uid)
        self._unprepare_until_ok(claim)
        self.released.append(claim)

    # --- invariants -------------------------------------------------------------------------------

    def _kind_problems(self, claims: Mapping[str, ClaimRecord], *, final: bool) -> list[str]:
        owners: Counter[str] = Counter(d.device for r in claims.values() for d in r.devices)
        found = [f"device {d} is held by {n} claims" for d, n in owners.items() if n > 1]
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
        return found

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

    def kind_operations(self) -> Sequence[tuple[Callable[[], None], int]]:
        return ((self.op_driver_reload, 1), (self.op_conflict, 1))



def campaign_node() -> NodeSpec:
    """The campaign's node (crashcampaign-node.yaml) with GPUs 4-7 also offered for passthrough, GPU 6's NIC allowed
    to move with it."""
    return NodeSpec(NODE, f"fake:{NODE_FILE}", plugin_env={
        "DRA_DRIVER_PASSTHROUGH": PASSTHROUGH_GPUS, "DRA_DRIVER_PASSTHROUGH_ALLOW_REBIND": ALLOW_REBIND,
    })
