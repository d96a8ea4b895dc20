"""Per-claim CDI specs: what the container runtime injects for each prepared device.

One transient spec per claim, `<cdi-root>/k8s.<driver>-claim_<node>_<claimUID>.json`, kind `k8s.<driver>/claim`,
one CDI device per allocated device named `<claimUID>-<device>`. The spec carries the lowest cdiVersion
that covers what it uses (podman and older runtimes reject versions they do not know). The node name in
the file name lets the orphan sweep touch only this node's files where several nodes share a CDI dir
(the sandbox, or a runtime dir on shared storage); it is shortened where the name would pass the 255-byte limit
(`cdi.writer.node_claim_spec_name`).

Two edit builders:
- `RealCdiEdits` (plugin/cdidriverfiles.py): device nodes of the allocated GPU (and the MIG capability nodes of a
  MIG device), the control nodes, and the driver's user-space libraries, tools, GSP firmware and daemon sockets
  mounted read-only from the host driver root, with the container toolkit's hooks where the node has them.
- `FakeCdiEdits`: env vars that describe each device and no device nodes, so a spec resolves anywhere.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import structlog

from dra_driver.cdi.claimspecs import ClaimSpecFiles, cdi_device_name
from dra_driver.cdi.model import ContainerEdits, Device, DeviceNode, Mount, Spec
from dra_driver.cdi.version import minimum_version
from dra_driver.cdi.writer import CDI_ROOT_HINT
from dra_driver.fsutil import GroupCommit, explain_os_error, sync_deferred
from dra_driver.inventory.catalog import AllocatableDevice
from dra_driver.kubeletplugin.driver import PrepareResult
from dra_driver.kubeletplugin.names import is_uid
from dra_driver.kubeletplugin.pipeline import PrepareOutcome, UnprepareOutcome

log = structlog.get_logger(__name__)

# Without the toolkit's hooks, driver libraries also appear here: every CUDA image names this dir in its own
# LD_LIBRARY_PATH (the nvidia-docker convention), whatever its distribution's loader search path is.
CONTAINER_LIB_DIR = "/usr/local/nvidia/lib64"


# Where a client container sees the MPS pipe directory (as NVIDIA's driver mounts it) and the shared memory.
CONTAINER_MPS_PIPE_DIR = "/tmp/nvidia-mps"  # noqa: S108 - a path inside the container, bind-mounted
CONTAINER_SHM_DIR = "/dev/shm"  # noqa: S108 - inside the container
MPS_MOUNT_OPTIONS = ("rw", "nosuid", "nodev", "bind")


@dataclass(frozen=True)
class MpsClient:
    """How a device's containers reach its MPS daemon: host directories to mount, and the share's own limits."""

    pipe_directory: str
    shm_directory: str
    env: tuple[str, ...] = ()


@dataclass(frozen=True)
class VfioCdi:
    """A GPU passed through to a VM: which VFIO device nodes its VM process gets (docs/passthrough.md)."""

    group: int  # /dev/vfio/<group>
    vfio_dev: str | None = None  # with IOMMUFD: /dev/vfio/devices/<vfio_dev>
    iommufd: bool = False
    api_device: bool = False  # /dev/vfio/vfio (legacy container) or /dev/iommu (IOMMUFD)


@dataclass(frozen=True)
class DeviceForCdi:
    """One prepared device as the CDI layer needs it."""

    allocatable: AllocatableDevice
    visible_uuid: str  # GPU UUID, or MIG UUID for a MIG device
    sharing: str
    request_names: tuple[str, ...] = ()
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    mps: MpsClient | None = None
    vfio: VfioCdi | None = None  # a GPU passed through, or a vGPU's VF: the VFIO nodes its VM gets
    vgpu: VgpuCdi | None = None
    fm_partition: FmPartitionCdi | None = None  # a Fabric Manager partition: every member GPU's VFIO nodes


@dataclass(frozen=True)
class VgpuCdi:
    """A vGPU made for a VM (docs/vgpu.md): the VF it lives on (or its mediated device's UUID) and its type, told to
    the VM's container."""

    vf: str | None  # the VF's PCI address
    type_name: str
    mdev: str | None = None  # the mediated device's UUID


@dataclass(frozen=True)
class FmPartitionCdi:
    """A Fabric Manager partition passed through to a VM (docs/passthrough.md): its id, and each member GPU's VFIO
    nodes and PCI address, in FM's order."""

    partition_id: int
    gpus: tuple[VfioCdi, ...]
    addresses: tuple[str, ...]


def device_vfio(device: DeviceForCdi) -> tuple[VfioCdi, ...]:
    """Every VFIO node set the device's VM gets: a partition's members, or the one GPU or VF."""
    if device.fm_partition is not None:
        return device.fm_partition.gpus
    return (device.vfio,) if device.vfio is not None else ()


class EditsBuilder(Protocol):
    def device_edits(self, device: DeviceForCdi) -> ContainerEdits: ...

    def claim_edits(self, devices: Sequence[DeviceForCdi]) -> ContainerEdits: ...


class ClaimSpecWriter(ClaimSpecFiles):
    """The only writer of this driver's CDI files."""

    def __init__(
        self, cdi_root: Path, driver_name: str, edits: EditsBuilder, node_name: str, *, defer_sync: bool = False
    ) -> None:
        # Concurrent prepares write their specs in shared flushes (one directory fsync for all of them). With
        # `defer_sync` (the plugin's): no directory fsync of its own at all; the prepare pipeline's `DurableSpecs`
        # makes the spec durable before the kubelet's answer, in the fsync of the device metadata spec written
        # after it where there is one (docs/architecture.md "Durable files").
        super().__init__(cdi_root, driver_name, node_name, is_uid, GroupCommit(), defer_sync=defer_sync)
        self._edits = edits

    def _spec(self, claim_uid: str, devices: Sequence[DeviceForCdi]) -> Spec:
        cdi_devices = tuple(
            Device(name=cdi_device_name(claim_uid, d.allocatable.name), container_edits=self._edits.device_edits(d))
            for d in devices
        )
        spec = Spec(
            cdi_version="0.3.0",
            kind=self.kind,
            devices=cdi_devices,
            container_edits=self._edits.claim_edits(devices),
        )
        return Spec(
            cdi_version=minimum_version(spec),
            kind=spec.kind,
            devices=spec.devices,
            container_edits=spec.container_edits,
        )

    def write(self, claim_uid: str, devices: Sequence[DeviceForCdi]) -> dict[str, str]:
        """Write the claim's spec; returns device name -> fully-qualified CDI id."""
        self.write_spec(claim_uid, self._spec(claim_uid, devices))
        return {d.allocatable.name: self.cdi_id(claim_uid, d.allocatable.name) for d in devices}

    def problem(self, claim_uid: str, devices: Sequence[DeviceForCdi]) -> str | None:
        """None when the claim's spec file holds exactly what `write` would write now; else what is wrong
        (missing, truncated, edited, or stale because the driver files on the host changed)."""
        return self.spec_problem(claim_uid, self._spec(claim_uid, devices))


@dataclass(frozen=True)
class DurableSpecs:
    """The prepare pipeline's observer that makes the claims' CDI specs durable before the kubelet's answer: the
    engine's spec writer (`defer_sync`) renames a spec into `cdi_root` without the directory's fsync, and the device
    metadata observer's own spec, written into the same directory after it, fsyncs that directory once for both.
    This observer, after the metadata one, fsyncs the directory only where a rename is still not covered (device
    metadata off or failed, a repaired spec): one fsync per prepare instead of two (docs/architecture.md "Durable
    files"). A failed fsync fails the call's prepared claims (the kubelet retries; the spec stays pending and the
    retry's answer syncs it)."""

    cdi_root: Path

    def prepared(self, outcomes: Sequence[PrepareOutcome]) -> Mapping[str, PrepareResult]:
        answered = [o.ref for o in outcomes if not o.refused and not o.result.error]
        if not answered:
            return {}
        try:
            sync_deferred(self.cdi_root)
        except OSError as exc:
            problem = explain_os_error(exc, self.cdi_root, "fsync of the CDI spec dir (--cdi-root)", CDI_ROOT_HINT)
            log.warning("making the CDI specs durable failed", error=problem)
            return {ref.uid: PrepareResult(error=f"prepare {ref.namespace}/{ref.name}: {problem}") for ref in answered}
        return {}

    def unprepared(self, outcomes: Sequence[UnprepareOutcome]) -> Mapping[str, str]:
        return {}  # a removal need not be durable before its answer (docs/architecture.md "Durable files")


def _env_key(device_name: str) -> str:
    return "DRA_DEVICE_" + re.sub(r"[^A-Za-z0-9]", "_", device_name).upper()


def visible_edits(devices: Sequence[DeviceForCdi]) -> ContainerEdits:
    """NVIDIA_VISIBLE_DEVICES / CUDA_VISIBLE_DEVICES for the whole claim — only where that is exact.

    CDI applies spec-level edits to every container that gets ANY device of the spec, and a later env value
    replaces an earlier one. So the claim-wide list is right only when every container that gets one of the
    claim's devices gets all of them: when all devices serve the same request(s). For a claim with several
    requests (a container may reference just one) the variables are left out; each device's own
    `DRA_DEVICE_<NAME>_UUID` says exactly what a container got, and on real GPUs the injected device nodes
    are what CUDA enumerates anyway.
    """
    if len({d.request_names for d in devices}) != 1:
        return ContainerEdits()
    uuids = ",".join(d.visible_uuid for d in devices)
    return ContainerEdits(env=(f"NVIDIA_VISIBLE_DEVICES={uuids}", f"CUDA_VISIBLE_DEVICES={uuids}"))


def mps_edits(devices: Sequence[DeviceForCdi]) -> ContainerEdits:
    """The claim's MPS daemon for every container of the claim: CUDA_MPS_PIPE_DIRECTORY, the pipe directory and
    the daemon's shared memory as /dev/shm, and a share's own limits. Claim-wide, because a CUDA process talks to
    one daemon and the mounts must appear once (the prepare engine refuses claims that would need two)."""
    client = next((d.mps for d in devices if d.mps is not None), None)
    if client is None:
        return ContainerEdits()
    return ContainerEdits(
        env=(f"CUDA_MPS_PIPE_DIRECTORY={CONTAINER_MPS_PIPE_DIR}", *client.env),
        mounts=(
            Mount(host_path=client.pipe_directory, container_path=CONTAINER_MPS_PIPE_DIR, options=MPS_MOUNT_OPTIONS),
            Mount(host_path=client.shm_directory, container_path=CONTAINER_SHM_DIR, options=MPS_MOUNT_OPTIONS),
        ),
    )


def device_identity_env(device: DeviceForCdi) -> tuple[str, ...]:
    """Per-device variables with names of their own, so they never collide between devices."""
    key = _env_key(device.allocatable.name)
    env = [
        f"{key}_UUID={device.visible_uuid}",
        f"{key}_TYPE={device.allocatable.kind.type_attribute}",
        f"{key}_PARENT_UUID={device.allocatable.gpu.uuid}",
        f"{key}_PRODUCT={device.allocatable.gpu.info.name}",
        f"{key}_SHARING={device.sharing}",
    ]
    if device.allocatable.profile is not None:
        env.append(f"{key}_PROFILE={device.allocatable.profile.name}")
    if device.vgpu is not None:
        env.append(f"{key}_VGPU_TYPE={device.vgpu.type_name}")
        env.append(f"{key}_PCI_BUS_ID={device.vgpu.vf}" if device.vgpu.vf else f"{key}_MDEV_UUID={device.vgpu.mdev}")
    if device.fm_partition is not None:
        env.append(f"{key}_FM_PARTITION_ID={device.fm_partition.partition_id}")
        env.append(f"{key}_PCI_BUS_IDS={','.join(device.fm_partition.addresses)}")
    return tuple(env)


# NVIDIA's runtime hook must not hand a passthrough claim's containers any GPU (the GPU is the VM's now).
VFIO_VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES=void"


def vfio_device_paths(vfio: VfioCdi) -> tuple[str, ...]:
    """The VM's device node for one passed-through GPU: its IOMMUFD cdev, or its IOMMU group's node."""
    if vfio.iommufd and vfio.vfio_dev:
        return (f"/dev/vfio/devices/{vfio.vfio_dev}",)
    return (f"/dev/vfio/{vfio.group}",)


def vfio_claim_paths(devices: Sequence[DeviceForCdi]) -> tuple[str, ...]:
    """The claim-wide VFIO API node where a device's config asks for it (enableAPIDevice)."""
    wanted = [d.vfio for d in devices if d.vfio is not None and d.vfio.api_device]
    if not wanted:
        return ()
    return ("/dev/iommu",) if any(v.iommufd for v in wanted) else ("/dev/vfio/vfio",)


def is_passthrough(devices: Sequence[DeviceForCdi]) -> bool:
    return any(d.vfio is not None for d in devices)


# What a fake VFIO node is on the host: a device every container may have, so a real runtime (podman) can create
# the container with `/dev/vfio/<group>` at the path a VM pod is checked for, on a machine without VFIO.
FAKE_VFIO_HOST_NODE = "/dev/null"


class FakeCdiEdits:
    """Describes each device in env vars; no GPU device nodes, so the spec resolves on any machine. A passed-through
    GPU still gets its VFIO nodes (they name the fake IOMMU group, which is what a VM pod is checked for), backed
    by FAKE_VFIO_HOST_NODE on the host."""

    def device_edits(self, device: DeviceForCdi) -> ContainerEdits:
        if device.vfio is not None:
            paths = [p for vfio in device_vfio(device) for p in vfio_device_paths(vfio)]
            nodes = tuple(DeviceNode(path=p, host_path=FAKE_VFIO_HOST_NODE) for p in paths)
            return ContainerEdits(env=device_identity_env(device), device_nodes=nodes)
        return ContainerEdits(env=device_identity_env(device))

    def claim_edits(self, devices: Sequence[DeviceForCdi]) -> ContainerEdits:
        if is_passthrough(devices):
            nodes = tuple(DeviceNode(path=p, host_path=FAKE_VFIO_HOST_NODE) for p in vfio_claim_paths(devices))
            return ContainerEdits(env=(VFIO_VISIBLE_DEVICES,), device_nodes=nodes)
        visible, mps = visible_edits(devices), mps_edits(devices)
        return ContainerEdits(env=(*visible.env, *mps.env), mounts=mps.mounts)
