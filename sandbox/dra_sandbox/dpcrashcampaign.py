"""The crash campaign's device-plugin part (docs/device-plugin.md "One GPU, one world", docs/sandbox.md "Crash
campaign"): the real kubelet plugin with `--device-plugin on` on a sandbox node whose kubelet runs the device manager
and PodResources, driven with random trials in the campaign's one trial loop (crashtrials.run_together). Beside the
shared DRA operations on whole GPUs (new claims, prepared again, unprepared, stale unprepares, restarts), pods asking
for `nvidia.com/gpu` start (the kubelet's admission calls Allocate) and end (their GPUs return once PodResources no
longer lists them and the grace has passed), and a stale claim on a GPU a pod holds must be refused. With
`crash_probability` an operation runs in a plugin armed to SIGKILL itself at a point it reaches: a DRA prepare mostly
at `deviceplugin:guard-after-reserve` (after it, the kubelet retries the claim, or its pod goes and the claim is
never asked for again), a pod's admission at `deviceplugin:allocate-after-record` (the kubelet rejects the pod; the
record already holds its GPUs), a pod's end at `deviceplugin:release-after-record` (the reconcile that releases its
GPUs); or the call is SIGKILLed after a random delay; then the plugin is restarted.

Checks after every trial, from the ownership record, the checkpoint bytes, the CDI directory and the pods: what
every part's claims must hold (crashcampaign.NodeCampaign); no GPU both in the ownership record's `allocated` and in
a claim record or a DRA reservation; every running pod's GPUs in `allocated` and in no claim record; a GPU no running
pod holds (its pod ended, or its Allocate crashed) released within RETURN_WITHIN_S; a reservation whose claim is not
prepared (its prepare crashed, the claim went away) dropped within RETURN_WITHIN_S. At the end, every pod ended and
every claim unprepared: the record empty, every GPU back in the slices and allocatable on the Node.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from dra_driver.deviceplugin.ownership import FILE_NAME, Ownership, OwnershipFile
from dra_driver.deviceplugin.settings import RESOURCE_NAME
from dra_driver.plugin.checkpoint import ClaimRecord
from dra_driver.plugin.faults import ENV_VAR
from dra_sandbox.cluster import NodeSpec, SandboxCluster
from dra_sandbox.crashcampaign import CampaignReport, CampaignSettings, ClaimModel, NodeCampaign
from dra_sandbox.polling import wait_for

DP_NODE: Final = "dp-node"
GPUS: Final = 8
SLOTS: Final = tuple(f"gpu-{g}" for g in range(GPUS))
GUARD_POINT: Final = "deviceplugin:guard-after-reserve"
ALLOCATE_POINT: Final = "deviceplugin:allocate-after-record"
RELEASE_POINT: Final = "deviceplugin:release-after-record"
DP_POINT_SHARE: Final = 0.5  # share of a DRA prepare's armed crashes that land on the claim guard's point
# The plugin's defaults (deviceplugin/settings.py): an allocation PodResources does not list is kept for the grace
# (10 s), a reservation whose claim is not in the checkpoint too, and PodResources is asked every 5 s; the rest is
# room for restarts and a loaded machine.
RETURN_WITHIN_S: Final = 40.0
POD_TIMEOUT_S: Final = 60.0
PODS: Final = "/api/v1/namespaces/default/pods"


def dp_node(name: str = DP_NODE) -> NodeSpec:
    """A DGX H100 (MIG static) whose plugin also serves `nvidia.com/gpu` (the sandbox's `device_plugin`)."""
    return NodeSpec(name, "fake:dgx-h100", mig_mode="static")


@dataclass
class DpReport(CampaignReport):
    claims: int = 0  # DRA claims prepared
    pods: int = 0  # pods asking for nvidia.com/gpu that ran
    pods_rejected: int = 0  # ... that the kubelet rejected (no healthy free GPU, or their Allocate crashed)
    releases: int = 0  # GPUs the plugin gave back after their pod ended or their Allocate crashed

    def title(self) -> str:
        return "device-plugin crash campaign"

    def detail(self) -> str:
        return (f"{self.claims} DRA claims ({self.abandoned} abandoned after a crash), {self.pods} device-plugin pods "
                f"({self.pods_rejected} rejected), {self.releases} GPUs returned, {self.refused_conflicts} claims on a "
                "pod's GPU refused")  # fmt: skip


class DpCampaign(NodeCampaign[DpReport]):
    """The campaign's shared machinery (crashcampaign.NodeCampaign) on a node serving both worlds."""

    family = "deviceplugin"
    focus_share = DP_POINT_SHARE

    def __init__(self, cluster: SandboxCluster, settings: CampaignSettings,
                 progress: Callable[[str], None] | None = None, node: str = DP_NODE) -> None:  # fmt: skip
        super().__init__(cluster, node, settings, DpReport(), progress)
        gpus = self._read_gpus()
        self.uuid_of = {f"gpu-{m}": g.uuid for m, g in gpus.items()}
        self.pods: dict[str, frozenset[str]] = {}  # running pods: name -> the GPUs the kubelet gave them
        self.returning: dict[str, float] = {}  # GPU -> when it must be released (monotonic)
        self.dropping: dict[str, float] = {}  # claim UID of a left reservation -> when it must be dropped
        self._pod_number = 0

    # --- the two worlds as the node sees them --------------------------------------------------------------------

    def ownership(self) -> Ownership:
        return OwnershipFile(self.plugin.plugin_dir / FILE_NAME).load()

    def _allocatable(self) -> str | None:
        node = self.cluster.api.get(f"/api/v1/nodes/{self.node}") or {}
        return ((node.get("status") or {}).get("allocatable") or {}).get(RESOURCE_NAME)

    def _slice_gpus(self) -> set[str]:
        listed = self.cluster.api.get("/apis/resource.k8s.io/v1/resourceslices") or {}
        return {d["attributes"]["uuid"]["string"] for s in listed.get("items") or []
                if s["spec"].get("nodeName") == self.node for d in s["spec"].get("devices") or []
                if d["attributes"]["type"]["string"] == "gpu"}  # fmt: skip

    def _dra_gpus(self, claims: Mapping[str, ClaimRecord]) -> set[str]:
        return {d.gpu_uuid for r in claims.values() for d in (*r.devices, *r.allocated) if d.gpu_uuid is not None}

    def _pod_gpus(self) -> set[str]:
        return {u for gpus in self.pods.values() for u in gpus}

    def _restart(self, env: dict[str, str] | None = None) -> None:
        super()._restart(env)
        self._wait_registered()

    def _wait_registered(self) -> None:
        """Until the kubelet's device manager lists the restarted plugin's GPUs again (Node allocatable: every GPU
        DRA does not hold), so that a pod's admission reaches the plugin; a plugin that does not register within the
        timeout leaves the pod to be rejected, which the checks allow."""
        held = len(self._dra_gpus(self._recorded_claims()) | set(self.ownership().dra))
        with contextlib.suppress(TimeoutError):
            wait_for(lambda: self._allocatable() == str(GPUS - held), 30, "the device manager's view", interval=0.1)

    # --- DRA claims ----------------------------------------------------------------------------------------------

    def _free_slots(self) -> list[str]:
        """Whole GPUs no claim holds and the device plugin does not own (the slices leave those out)."""
        used = {d for c in (*self.prepared.values(), *self.releasing) for d in c.devices}
        theirs = set(self.ownership().allocated) | self._pod_gpus() | set(self.returning)
        return [s for s in SLOTS if s not in used and self.uuid_of[s] not in theirs]

    def op_prepare_new(self, near: ClaimModel | None = None) -> None:
        free = self._free_slots()
        if not free:
            return self.op_pod_end()
        devices = tuple(sorted(self.rng.sample(free, k=min(len(free), self.rng.choice((1, 1, 2))))))
        claim = self._new_claim(devices, "dp")
        self.report.claims += 1
        self._prepare_or_abandon(claim, [GUARD_POINT])
        return None

    def _abandon(self, claim: ClaimModel, killed_at: str) -> None:
        if killed_at != GUARD_POINT:
            return super()._abandon(claim, killed_at)
        # Killed before the engine ran (no record): the claim goes and the kubelet never asks again; the guard's
        # reservation must go by itself.
        self.dropping[claim.ref.uid] = time.monotonic() + RETURN_WITHIN_S
        self.cluster.api.request("DELETE", f"/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/"
                                           f"{claim.ref.name}")  # fmt: skip
        return None

    def op_conflict(self) -> None:
        """A stale allocation on a GPU a running pod holds: the claim guard must refuse it."""
        held = sorted(s for s in SLOTS if self.uuid_of[s] in self._pod_gpus())
        if not held:
            return self.op_pod_new()
        self._expect_refused(self._new_claim((self.rng.choice(held),), "dp-stale"), "a GPU a device-plugin pod holds")
        return None

    # --- pods asking for nvidia.com/gpu --------------------------------------------------------------------------

    def op_pod_new(self) -> None:
        """A pod asking for one or two GPUs, bound to the node (the kubelet admits it: Allocate), perhaps with the
        plugin armed at Allocate's crash point."""
        armed = self.rng.random() < self.settings.crash_probability
        if armed:
            self._restart({ENV_VAR: ALLOCATE_POINT})
        self._pod_number += 1
        name = f"dp-{self._pod_number}"
        self.cluster.apply(pod_spec(name, self.node, self.rng.choice((1, 1, 2))))
        [gpus] = wait_for(lambda: self._admitted(name), POD_TIMEOUT_S, f"pod {name} to run or be rejected", 0.1)
        if gpus:
            self.pods[name] = gpus
            self.report.pods += 1
        else:
            self.report.pods_rejected += 1
            self._delete_pod(name)
        if armed:
            if not gpus and self._exits():  # a rejected pod; a plugin that died closed its socket first
                self.report.crashes += 1
                self.report.kills[ALLOCATE_POINT] += 1
                self._expect_returns(set(self.ownership().allocated) - self._pod_gpus())
            else:
                self.report.unreached.append(f"{ALLOCATE_POINT}: pod {name} {'ran' if gpus else 'was rejected'}")
            self._restart()
            self._check_reported_again()

    def _admitted(self, name: str) -> tuple[frozenset[str]] | None:
        """The GPUs the pod's container got (its NVIDIA_VISIBLE_DEVICES as the simulator's CDI check resolved
        it) once it runs, none once the kubelet rejected it; None before either."""
        pod = self.cluster.api.get(f"{PODS}/{name}") or {}
        phase = (pod.get("status") or {}).get("phase")
        if phase == "Failed":
            return (frozenset(),)
        record = ((pod.get("metadata") or {}).get("annotations") or {}).get("sandbox.dra.dev/containers")
        if phase != "Running" or not record:
            return None
        env = json.loads(record)["main"].get("env") or {}
        visible = env.get("NVIDIA_VISIBLE_DEVICES")
        return (frozenset(visible.split(",")),) if visible else None

    def op_pod_end(self) -> None:
        """A running pod ends; its GPUs must return. Perhaps with the plugin armed at the release's crash point: it
        dies at the reconcile that records the release (this pod's, or an earlier one's still due)."""
        if not self.pods:
            return self.op_pod_new()
        name = self.rng.choice(sorted(self.pods))
        armed = self.rng.random() < self.settings.crash_probability
        if armed:
            self._restart({ENV_VAR: RELEASE_POINT})
        self._delete_pod(name)
        self._expect_returns(set(self.pods.pop(name)))
        if armed:
            try:
                code = self.plugin.wait_exit(RETURN_WITHIN_S)
            except subprocess.TimeoutExpired:
                self.report.unreached.append(f"{RELEASE_POINT}: no release within {RETURN_WITHIN_S:.0f} s")
            else:
                self.report.crashes += 1
                self.report.kills[RELEASE_POINT] += 1
                if code != -signal.SIGKILL:
                    self.report.violations.append(f"the plugin armed at {RELEASE_POINT} exited with {code}, not "
                                                  f"SIGKILL (log: {self.plugin.log_file})")  # fmt: skip
            self._restart()
            self._check_reported_again()
        return None

    def _delete_pod(self, name: str) -> None:
        self.cluster.api.request("DELETE", f"{PODS}/{name}")
        wait_for(lambda: self.cluster.api.get(f"{PODS}/{name}") is None, POD_TIMEOUT_S, f"pod {name} gone", 0.1)

    def _expect_returns(self, gpus: set[str]) -> None:
        due = time.monotonic() + RETURN_WITHIN_S
        for gpu in gpus:
            self.returning.setdefault(gpu, due)

    def kind_operations(self) -> Sequence[tuple[Callable[[], None], int]]:
        return ((self.op_pod_new, 3), (self.op_pod_end, 2), (self.op_conflict, 1))

    # --- invariants ----------------------------------------------------------------------------------------------

    def _kind_problems(self, claims: Mapping[str, ClaimRecord], *, final: bool) -> list[str]:
        owned = self.ownership()
        allocated, reserved = set(owned.allocated), set(owned.dra)
        dra = self._dra_gpus(claims)
        pods = self._pod_gpus()
        found = [f"GPU {u} is the device plugin's and a DRA claim's" for u in sorted(allocated & (dra | reserved))]
        found += [f"GPU {u} of a running pod is not in the device plugin's record" for u in sorted(pods - allocated)]
        found += [f"GPU {u} of a running pod is held by a DRA claim" for u in sorted(pods & dra)]
        now = time.monotonic()
        for gpu, due in sorted(self.returning.items()):
            if gpu not in allocated:
                self.report.releases += 1
                del self.returning[gpu]
            elif gpu in pods:  # another pod holds it again (the record kept it: a release not yet due)
                del self.returning[gpu]
            elif now > due:
                found.append(f"GPU {gpu} was not returned within {RETURN_WITHIN_S:.0f} s of its pod's end or its "
                             "crashed Allocate")  # fmt: skip
        for uid in {r.claim_uid for r in owned.dra.values()} - set(self.prepared):
            due = self.dropping.setdefault(uid, now + RETURN_WITHIN_S)
            if now > due:
                found.append(f"the reservation of claim {uid} (not prepared) was not dropped within "
                             f"{RETURN_WITHIN_S:.0f} s")  # fmt: skip
        if final:
            if allocated or reserved:
                found.append(f"the device plugin's record still holds {sorted(allocated)} and reservations "
                             f"{sorted(reserved)} after every pod and claim ended")  # fmt: skip
            if self._allocatable() != str(GPUS) or len(self._slice_gpus()) != GPUS:
                found.append(f"after every pod and claim ended the Node's allocatable {RESOURCE_NAME} is "
                             f"{self._allocatable()} and the slices hold {len(self._slice_gpus())} GPUs, not {GPUS}")
        return found

    def final_check(self) -> None:
        """Every pod ended, then (every claim already unprepared) the GPUs' return awaited, then the final checks."""
        for name in sorted(self.pods):
            self._delete_pod(name)
            self._expect_returns(set(self.pods.pop(name)))

        def settled() -> bool:
            owned = self.ownership()
            return (not owned.allocated and not owned.dra and self._allocatable() == str(GPUS)
                    and len(self._slice_gpus()) == GPUS)  # fmt: skip

        with contextlib.suppress(TimeoutError):  # the check says what is left
            wait_for(settled, RETURN_WITHIN_S + 20, "every GPU back", interval=0.5)
        self.check("after every pod ended and every claim was unprepared", final=True)


def pod_spec(name: str, node: str, gpus: int) -> dict[str, Any]:
    """A pod asking for `gpus` of nvidia.com/gpu, bound to `node`."""
    container = {"name": "main", "image": "busybox", "command": ["sh", "-c", "sleep 3600"],
                 "resources": {"limits": {RESOURCE_NAME: str(gpus)}}}  # fmt: skip
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": node, "containers": [container], "terminationGracePeriodSeconds": 1}}
