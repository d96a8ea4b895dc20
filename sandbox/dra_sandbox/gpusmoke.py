"""`dra-sandbox gpu-smoke` (`make gpu-smoke`): the driver end to end on THIS machine's real GPUs (docs/nvml-real.md).

What it does, printing each step: the driver layout check; the inventory from real NVML; a sandbox API server (in
this process) that the kubelet plugin (in this process, `--mig-mode static`) publishes its ResourceSlices to; a
whole GPU prepared and unprepared over the plugin's real DRA socket, as the kubelet calls it; where a GPU already has
MIG mode enabled, one MIG device the same way; `nvidia-smi -L` in a podman container given the claim's CDI device
(where podman and an image are there); and that every CDI spec is gone after unprepare.

What it never does to the machine: change MIG mode, reset a GPU, or touch a MIG instance it did not create. That is
why the plugin runs `static`: the dynamic layout's start-up sweep would destroy instances no claim owns and turn MIG
off on idle Hopper GPUs. A MIG-enabled GPU without instances gets one instance of its smallest profile, created by
the smoke and destroyed again at the end (also on failure). Where the machine has no NVIDIA GPU it prints one SKIP
line and exits 0. `--nvml fake:<preset>` runs the same steps on simulated GPUs (its tests; no container step).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TextIO

import grpc

from dra_driver import defaults
from dra_driver.commands.flags import Flag, FlagParser, add_flags
from dra_driver.inventory.catalog import MigOffering
from dra_driver.k8s.client import KubeRest
from dra_driver.nvidiadriver.wait import DriverPaths
from dra_driver.nvml.backend import NvmlBackend
from dra_driver.nvml.types import GpuInfo, NvmlError, NvmlUnavailableError
from dra_driver.plugin.driverlayout import CdiHooks, LayoutSettings, Severity, inspect_driver_layout
from dra_sandbox.kubelet.draclient import ClaimRef, DraClient
from dra_sandbox.objects import create_allocated_claim
from dra_sandbox.polling import wait_for

PREFIX = "gpu-smoke:"
NVIDIA_PCI_VENDOR = "0x10de"
GPU_PCI_CLASSES = ("0x0300", "0x0302")  # VGA compatible / 3D controller (data-center GPUs are 0x0302)
NAMESPACE = "gpu-smoke"
CONTAINER_SMI = "/usr/local/nvidia/bin/nvidia-smi"  # where the claim's CDI spec mounts nvidia-smi (plugin/cdi.py)


class SmokeFailure(RuntimeError):
    """A step that did not do what it must; the message says which and what was seen."""


FLAGS: Final = (
    Flag("--nvml", default="real", help="real (this machine's GPUs) | fake:<preset> (the tests)"),
    Flag("--driver-root", default="/", help="the NVIDIA driver root (/run/nvidia/driver: GPU Operator)"),
    Flag("--cdi-root", default="", help="where the claim CDI specs are written; default /var/run/cdi with real GPUs "
         "(podman 4.x reads only /etc/cdi and /var/run/cdi), a temporary directory with fake ones"),
    Flag("--image", default="", help="image for the container step (default localhost/dra-driver:<version>, "
         "`make image`); it needs a C library for nvidia-smi"),
    Flag("--no-container", switch=True, help="skip the podman step"),
    Flag("--sysfs-root", default="/sys", help="where to look for NVIDIA PCI devices"),
)


def add_arguments(parser: FlagParser) -> None:
    add_flags(parser, FLAGS)


def nvidia_pci_gpus(sysfs_root: Path) -> tuple[str, ...]:
    """PCI bus ids of the NVIDIA display/3D controllers under <sysfs>/bus/pci/devices (no NVML needed)."""
    base = sysfs_root / "bus/pci/devices"
    found = []
    with contextlib.suppress(OSError):
        for device in sorted(base.iterdir()):
            try:
                vendor = (device / "vendor").read_text().strip().lower()
                pci_class = (device / "class").read_text().strip().lower()
            except OSError:
                continue
            if vendor == NVIDIA_PCI_VENDOR and pci_class[:6] in GPU_PCI_CLASSES:
                found.append(device.name)
    return tuple(found)


@dataclass(frozen=True)
class Decision:
    """Run, skip (exit 0 with one line), or fail (exit 1): what the machine allows."""

    skip: str | None = None
    fail: str | None = None


def decide(pci_gpus: Sequence[str], nvml_error: str | None, nvml_gpus: int | None) -> Decision:
    """No NVIDIA GPU on PCI and no NVML: skip. A GPU on PCI that NVML cannot open is a broken node: fail (the
    driver missing or not loaded is what the smoke exists to find). NVML up with no GPU: skip."""
    if nvml_error is not None:
        if not pci_gpus:
            return Decision(skip=f"no NVIDIA GPU on this machine (no PCI display/3D controller of vendor "
                                 f"{NVIDIA_PCI_VENDOR}; {nvml_error})")
        return Decision(fail=f"NVIDIA GPU(s) at {', '.join(pci_gpus)} but {nvml_error}")
    if not nvml_gpus:
        return Decision(skip="NVML is available but reports no GPU")
    return Decision()


@dataclass
class Smoke:
    """One run; `out` gets every line it prints."""

    nvml: NvmlBackend
    fake: bool
    work: Path
    cdi_root: Path
    driver_root: Path
    out: TextIO
    image: str = ""
    container: bool = True
    node: str = field(default_factory=lambda: f"gpu-smoke-{socket.gethostname().split('.')[0].lower()}"[:63])
    created_mig: list[tuple[str, int, int]] = field(default_factory=list)  # (GPU UUID, GI id, CI id) we made
    seen: list[str] = field(default_factory=list)

    def say(self, message: str) -> None:
        print(f"{PREFIX} {message}", file=self.out, flush=True)

    # --- steps --------------------------------------------------------------------------------------

    def layout(self) -> None:
        if self.fake:
            self.say("layout check: skipped (fake NVML)")
            return
        problems = inspect_driver_layout(
            LayoutSettings(paths=DriverPaths(driver_root=self.driver_root, host_driver_root=self.driver_root),
                           cdi_hooks=CdiHooks.AUTO, toolkit_dir=Path("/usr/bin"))
        )
        for problem in problems:
            self.say(f"layout {problem}")
        errors = [p.message for p in problems if p.severity is Severity.ERROR]
        if errors:
            raise SmokeFailure("the driver layout is wrong: " + "; ".join(errors))
        if not problems:
            self.say(f"layout check: driver root {self.driver_root} is fine")

    def inventory(self) -> list[GpuInfo]:
        system = self.nvml.system_info()
        gpus = self.nvml.gpus()
        self.say(f"inventory: driver {system.driver_version}, {len(gpus)} GPU(s)")
        for gpu in gpus:
            mode = self.nvml.mig_mode(gpu.uuid)
            mig = "not MIG-capable" if mode is None else f"MIG {'on' if mode.current else 'off'}"
            self.say(f"  GPU {gpu.index} {gpu.name} {gpu.uuid} {gpu.pci_bus_id} minor {gpu.minor} ({mig})")
        return gpus

    def mig_gpu(self, gpus: Sequence[GpuInfo]) -> GpuInfo | None:
        """A GPU whose MIG mode is ALREADY on (never turned on here): one with MIG devices first (nothing is
        created); else one without any instance, which gets one made by the smoke (destroyed at the end)."""
        enabled = [g for g in gpus if (m := self.nvml.mig_mode(g.uuid)) is not None and m.current
                   and not m.change_pending]
        for gpu in enabled:
            if self.nvml.mig_devices(gpu.uuid):
                self.say(f"MIG: GPU {gpu.index} has MIG devices already; using one of them (nothing created)")
                return gpu
        for gpu in enabled:
            if not self.nvml.gpu_instances(gpu.uuid):  # a GPU instance without compute instances: leave it alone
                self._create_smallest_instance(gpu)
                return gpu
        self.say("MIG: no GPU has MIG mode enabled" + (" and free" if enabled else "")
                 + "; MIG step skipped (MIG mode is never changed here)")
        return None

    def _create_smallest_instance(self, gpu: GpuInfo) -> None:
        profiles = [p for p in self.nvml.gpu_instance_profiles(gpu.uuid) if p.placements]
        if not profiles:
            raise SmokeFailure(f"GPU {gpu.uuid} has MIG on but NVML lists no GPU instance profile with a placement")
        profile = min(profiles, key=lambda p: (p.slice_count, p.memory_mib, p.index))
        gi = self.nvml.create_gpu_instance(gpu.uuid, profile.id, profile.placements[0])
        try:
            ci_profiles = self.nvml.compute_instance_profiles(gpu.uuid, gi.id)
            full = max((p for p in ci_profiles if p.slice_count == profile.slice_count),
                       key=lambda p: p.multiprocessors, default=None)
            if full is None:
                raise SmokeFailure(f"no compute instance profile covers MIG {profile.name} on GPU {gpu.uuid}")
            ci = self.nvml.create_compute_instance(gpu.uuid, gi.id, full.id)
        except BaseException:
            self.nvml.destroy_gpu_instance(gpu.uuid, gi.id)
            raise
        self.created_mig.append((gpu.uuid, gi.id, ci.id))
        self.say(f"MIG: created {profile.name} (GPU instance {gi.id}, compute instance {ci.id}) on GPU {gpu.index} "
                 f"for this test; it is destroyed at the end")

    def destroy_created_mig(self) -> None:
        for gpu_uuid, gi_id, ci_id in reversed(self.created_mig):
            try:
                self.nvml.destroy_compute_instance(gpu_uuid, gi_id, ci_id)
                self.nvml.destroy_gpu_instance(gpu_uuid, gi_id)
                self.say(f"MIG: destroyed GPU instance {gi_id} on {gpu_uuid} (made by this test)")
            except NvmlError as exc:
                self.say(f"MIG: could not destroy GPU instance {gi_id} on {gpu_uuid}: {exc}; remove it with "
                         f"`nvidia-smi mig -dci -gi {gi_id} -i {gpu_uuid}` and `nvidia-smi mig -dgi -gi {gi_id}`")
        self.created_mig.clear()

    def prepare_and_check(self, rest: KubeRest, client: DraClient, device: dict[str, Any], uuid: str) -> None:
        name = device["name"]
        claim = create_allocated_claim(rest, namespace=NAMESPACE, name=f"smoke-{name}", driver=defaults.DRIVER_NAME,
                                       pool=self.node, devices=[name])
        ref = ClaimRef(NAMESPACE, claim["metadata"]["name"], claim["metadata"]["uid"])
        result = client.prepare([ref])[ref.uid]
        if not result.ok:
            raise SmokeFailure(f"NodePrepareResources of {name}: {result.error}")
        cdi_ids = [i for d in result.devices for i in d.cdi_device_ids]
        self.say(f"prepared {name} ({uuid}): CDI devices {', '.join(cdi_ids)}")
        spec_files = sorted(self.cdi_root.glob(f"*{ref.uid}*.json"))
        if not spec_files:
            raise SmokeFailure(f"prepared {name} but no CDI spec for claim {ref.uid} in {self.cdi_root}")
        for path in spec_files:
            spec = json.loads(path.read_text())
            for cdi_device in spec.get("devices", []):
                edits = cdi_device.get("containerEdits", {})
                nodes = [n["path"] for n in edits.get("deviceNodes", [])]
                self.say(f"  spec {path.name}: device {cdi_device['name']}: nodes {nodes or 'none'}")
            claim_edits = spec.get("containerEdits", {})
            self.say(f"  claim-wide: {len(claim_edits.get('deviceNodes', []))} device nodes, "
                     f"{len(claim_edits.get('mounts', []))} mounts")
        self.container_step(cdi_ids, uuid)
        failed = client.unprepare([ref])[ref.uid]
        if failed is not None:
            raise SmokeFailure(f"NodeUnprepareResources of {name}: {failed}")
        left = [p.name for p in spec_files if p.exists()]
        if left:
            raise SmokeFailure(f"unprepared {name} but its CDI spec is still there: {left}")
        rest.request("DELETE", f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims/{ref.name}")
        self.say(f"unprepared {name}: CDI spec removed")
        self.seen.append(name)

    def container_step(self, cdi_ids: Sequence[str], uuid: str) -> None:
        if self.fake or not self.container:
            self.say("  container: skipped" + (" (fake NVML)" if self.fake else " (--no-container)"))
            return
        podman = shutil.which("podman")
        if podman is None:
            self.say("  container: skipped (podman is not installed)")
            return
        image = self.image or container_image()
        if subprocess.run([podman, "image", "exists", image], capture_output=True, timeout=60,
                          check=False).returncode != 0:
            self.say(f"  container: skipped (image {image} is not here: `make image`, or --image)")
            return
        devices = [arg for cdi_id in cdi_ids for arg in ("--device", cdi_id)]
        command = [podman, "run", "--rm", "--network", "none", *devices, "--entrypoint", CONTAINER_SMI, image, "-L"]
        proc = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
        for line in (proc.stdout + proc.stderr).strip().splitlines():
            self.say(f"  container nvidia-smi -L: {line}")
        if proc.returncode != 0:
            raise SmokeFailure(f"`{' '.join(command)}` exited {proc.returncode}")
        if uuid not in proc.stdout:
            raise SmokeFailure(f"nvidia-smi -L in the container does not list {uuid}")


def container_image() -> str:
    from dra_sandbox.image import DEFAULT_IMAGE

    return DEFAULT_IMAGE


def published_devices(rest: KubeRest, node: str) -> list[dict[str, Any]]:
    slices = rest.request("GET", "/apis/resource.k8s.io/v1/resourceslices")["items"]
    return [d for s in slices if s["spec"].get("nodeName") == node for d in s["spec"].get("devices", [])]


def attribute(device: dict[str, Any], name: str) -> str | None:
    value = device.get("attributes", {}).get(name, {})
    return value.get("string") if isinstance(value, dict) else None


def pick(devices: Sequence[dict[str, Any]], kind: str, gpu_uuids: set[str]) -> tuple[dict[str, Any], str] | None:
    """The first published device of `kind` ("gpu" / "mig") on one of `gpu_uuids`, with its own UUID."""
    for device in devices:
        uuid = attribute(device, "uuid")
        parent = attribute(device, "parentUUID") if kind == "mig" else uuid
        if attribute(device, "type") == kind and uuid and parent in gpu_uuids:
            return device, uuid
    return None


@contextlib.contextmanager
def running_plugin(smoke: Smoke) -> Iterator[tuple[KubeRest, DraClient]]:
    from dra_driver.plugin.app import KubeletPlugin, PluginSettings
    from dra_sandbox.apiserver import ApiServer

    boot = smoke.work / "boot_id"
    boot.write_text("gpu-smoke\n")
    plugin_dir = smoke.work / "plugin"
    settings = PluginSettings(
        node_name=smoke.node, driver_name=defaults.DRIVER_NAME, plugin_dir=plugin_dir,
        registry_dir=smoke.work / "registry", cdi_root=smoke.cdi_root, driver_root=smoke.driver_root,
        host_driver_root=smoke.driver_root, mig_offering=MigOffering.STATIC, fake_cdi=smoke.fake,
        healthz_port=None, boot_id_path=boot, health_monitor=False, events=False,
    )
    with ApiServer() as server:
        rest = server.rest()
        rest.request("POST", "/api/v1/nodes", body={"apiVersion": "v1", "kind": "Node",
                                                    "metadata": {"name": smoke.node}})
        rest.request("POST", "/api/v1/namespaces", body={"apiVersion": "v1", "kind": "Namespace",
                                                         "metadata": {"name": NAMESPACE}})
        smoke.say(f"sandbox API server at {server.url}; kubelet plugin for node {smoke.node} (MIG layout static)")
        plugin = KubeletPlugin(settings, nvml=smoke.nvml, rest=rest)
        plugin.start()
        try:
            with grpc.insecure_channel(f"unix://{plugin_dir / 'dra.sock'}") as channel:
                yield rest, DraClient(channel, "v1.DRAPlugin", timeout_s=60)
        finally:
            plugin.stop()


def run_steps(smoke: Smoke) -> None:
    smoke.layout()
    gpus = smoke.inventory()
    mig_gpu = smoke.mig_gpu(gpus)
    whole = {g.uuid for g in gpus if (m := smoke.nvml.mig_mode(g.uuid)) is None or not m.current}
    try:
        with running_plugin(smoke) as (rest, client):
            devices = wait_for(lambda: published_devices(rest, smoke.node) or None, 60, "the plugin's ResourceSlices")
            kinds: dict[str, int] = {}
            for d in devices:
                kinds[attribute(d, "type") or "?"] = kinds.get(attribute(d, "type") or "?", 0) + 1
            smoke.say("published: " + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())))
            chosen = pick(devices, "gpu", whole)
            if chosen is None:
                smoke.say("whole GPU: none published with MIG off; whole-GPU step skipped")
            else:
                smoke.prepare_and_check(rest, client, *chosen)
            if mig_gpu is not None:
                mig = pick(devices, "mig", {mig_gpu.uuid})
                if mig is None:
                    raise SmokeFailure(f"GPU {mig_gpu.uuid} has MIG devices but the plugin published none of them")
                smoke.prepare_and_check(rest, client, *mig)
    finally:
        smoke.destroy_created_mig()
    if not smoke.seen:
        raise SmokeFailure("nothing was prepared (no whole GPU with MIG off and no MIG device)")


def run(args: argparse.Namespace) -> int:
    return smoke_main(args, out=None)


def smoke_main(args: argparse.Namespace, out: TextIO | None = None,
               open_nvml: Callable[[str, str], NvmlBackend] | None = None) -> int:
    import sys

    from dra_driver.nvml.factory import open_backend

    stream = out or sys.stdout
    fake = args.nvml.startswith("fake:")
    opener = open_nvml or (lambda spec, root: open_backend(spec, driver_root=None if fake else root))
    nvml = opener(args.nvml, args.driver_root)
    error: str | None = None
    try:
        nvml.init()
    except NvmlUnavailableError as exc:
        error = f"NVML: {exc}"
    count = None if error else len(nvml.gpus())
    pci = () if fake else nvidia_pci_gpus(Path(args.sysfs_root))
    decision = decide(pci, error, count)
    if decision.skip or decision.fail:
        if error is None:
            nvml.shutdown()
        word = "SKIP" if decision.skip else "FAIL"
        print(f"{PREFIX} {word}: {decision.skip or decision.fail}", file=stream, flush=True)
        return 0 if decision.skip else 1
    from dra_driver.observability.logging import configure_logging

    configure_logging("warning", "text")
    work = Path(tempfile.mkdtemp(prefix="dra-gpu-smoke-", dir="/tmp"))
    cdi_root = Path(args.cdi_root) if args.cdi_root else (work / "cdi" if fake else defaults.CDI_ROOT)
    smoke = Smoke(nvml=nvml, fake=fake, work=work, cdi_root=cdi_root, driver_root=Path(args.driver_root),
                  out=stream, image=args.image, container=not args.no_container)
    try:
        run_steps(smoke)
    except (SmokeFailure, NvmlError, OSError) as exc:
        smoke.say(f"FAIL: {exc}")
        return 1
    finally:
        nvml.shutdown()
        shutil.rmtree(work, ignore_errors=True)
    smoke.say(f"PASS: prepared and unprepared {', '.join(smoke.seen)} on {os.uname().nodename}")
    return 0
