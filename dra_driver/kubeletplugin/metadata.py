"""KEP-5304 device metadata: a file per prepared claim request that the container reads, and its CDI mount.

The layout, format and names are those of upstream's kubelet-plugin library (k8s.io/dynamic-resource-allocation,
`kubeletplugin/metadata.go` and `api/metadata`; docs/reference/passthrough.md "Device metadata (KEP-5304)"), so a
consumer written against it (KubeVirt's virt-launcher, `devicemetadata.ReadResourceClaimMetadata…`) finds ours:

- host file `<plugin-dir>/dra-device-metadata/<namespace>_<claimName>/<request>/metadata.json` (0644, dirs 0755):
  a concatenated JSON stream, the same `DeviceMetadata` once per supported version, newest first;
- CDI spec `<cdi-root>/<driver>_metadata_<claimUID>_<request>.json` (0644, cdiVersion 0.5.0, kind
  `<driver>/metadata`, device `<claimUID>_<request>`): a read-only bind mount of that file to
  `/var/run/kubernetes.io/dra-device-attributes/resourceclaims/<claimName>/<request>/<driver>-metadata.json`, or
  `…/resourceclaimtemplates/<podClaimName>/<request>/…` for a claim made from a template;
- the spec's CDI id `<driver>/metadata=<claimUID>_<request>` is added to the first device of that request in the
  Prepare response. `<request>` is the request's name without a subrequest; the file names the full one.

Upstream's names pass the kernel's 255-byte limit on a file name for names Kubernetes accepts (a namespace of 63
and a claim name of 253 make a 317-byte directory name). Where a name would not fit, the claim name in the
directory and the request name in the spec's file name are shortened by `fsutil.bounded_name` (a prefix and a hash
of the whole name; docs/kubelet-plugin.md "File names from API names"); every name that fits is upstream's, so
files written before the rule existed are found under the same names. The container path, the CDI device name and
the file's content are upstream's in every case (they have no such limit).

`MetadataFiles` is an observer on the prepare pipeline (pipeline.py): after the engine prepared a claim it writes
the files (atomically: readers see a whole file or none), and after the engine unprepared one it removes them.
What the layer adds beyond upstream's library, and why:
- a claim whose metadata cannot be written fails (upstream logs and starts the container without it: a VM that
  needs the file would then fail later with no hint); the kubelet retries;
- crash safety: the files are written after the driver's own record is durable and removed after it is gone, so
  a claim's files never exist without the driver having known the claim since before they were written.
  `sweep` (at start, and after the driver's own stale-claim cleanup) lists what exists first and asks the driver
  which claims it holds afterwards, then removes what no held claim owns, temp files of interrupted writes
  included; listing first is what makes it safe beside prepares in flight (theirs are already in that answer).
  Each spec is durable (file and directory entry) when `write` returns; its directory fsync is the CDI dir's, so
  it also makes durable the claim's own CDI spec that the engine renamed there just before
  (`fsutil.defer_dir_sync`). The metadata file is renamed into place whole but not fsynced (file nor request dir):
  no container reads it before a prepare of the claim in the current boot, and every prepare compares it byte for
  byte and rewrites what differs (the kubelet prepares every claim again after it restarts or the node reboots:
  it restores no claim as prepared from its checkpoint). So what a machine crash can do to it (lose it, leave it
  empty) is mended before anyone reads it; after a reboot the checkpoint is discarded anyway and the sweep removes
  the file. On a node these were two of the prepare's four fsyncs on the disk (the CDI dir is /run's tmpfs). A
  removal is not fsynced: what a machine crash brings back is a file of a claim the checkpoint no longer holds,
  which the sweep at start removes before the plugin serves (docs/architecture.md "Durable files");
- CDI specs are recognised as ours by their mount's host path (under our metadata dir), not by name alone: where
  several nodes share a CDI dir (the sandbox) one node's sweep never removes another's;
- a request's files are removed only when the file names the claim's UID: a claim deleted and re-created under
  the same name on the same node keeps the new claim's file when the old one is unprepared late.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import stat
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import msgspec
import structlog

from dra_driver.errors import DraDriverError
from dra_driver.fsutil import (
    ATOMIC_NAME_MAX,
    NAME_MAX,
    PATH_MAX,
    bounded_name,
    explain_os_error,
    fsync_dir,
    rename_into_place,
    write_temp_file,
)
from dra_driver.k8s.client import go_escaped
from dra_driver.kubeletplugin.driver import ClaimRef, DeviceResult, PrepareResult
from dra_driver.kubeletplugin.names import dns1123_label_problem
from dra_driver.kubeletplugin.pipeline import PrepareOutcome, UnprepareOutcome

log = structlog.get_logger(__name__)

METADATA_SUBDIR = "dra-device-metadata"
METADATA_FILE = "metadata.json"
CONTAINER_DIR = "/var/run/kubernetes.io/dra-device-attributes"
RESOURCE_CLAIMS_SUBDIR = "resourceclaims"
RESOURCE_CLAIM_TEMPLATES_SUBDIR = "resourceclaimtemplates"
CONTAINER_FILE_SUFFIX = "-metadata.json"
METADATA_GROUP = "metadata.resource.k8s.io"
METADATA_KIND = "DeviceMetadata"
# Newest first: the order of the objects in the stream. v1alpha1 is the only version upstream defines (1.36, 1.37).
METADATA_VERSIONS: tuple[str, ...] = ("v1alpha1",)
CDI_VERSION = "0.5.0"
CDI_CLASS = "metadata"
FILE_MODE = 0o644
DIR_MODE = 0o755
MOUNT_OPTIONS = ("ro", "bind")
REQUEST_NAME_MAX = 63  # a DNS label
# A request's part of a spec's file name: its name, or its name shortened by `bounded_name` (`<prefix>_<hash>`).
_REQUEST_PART = r"[a-z0-9-]+(?:_[0-9a-f]+)?"

Faults = Callable[[str], None]  # called with a crash point's name (the plugin's fault injection)


class MetadataError(DraDriverError):
    """Device metadata could not be written or removed; the message names the path and what to do."""


@dataclass(frozen=True)
class MetadataRequest:
    """One request of a prepared claim, as its metadata file describes it."""

    name: str  # the base request name (file and CDI names)
    ref: str  # "<request>" or "<request>/<subrequest>" (inside the file)
    devices: tuple[DeviceResult, ...]


def base_request(ref: str) -> str:
    return ref.split("/", 1)[0]


def container_path(driver: str, claim_name: str, pod_claim_name: str | None, request: str) -> str:
    """Where the container reads the file (upstream `ResourceClaimFilePath` / `ResourceClaimTemplateFilePath`)."""
    if pod_claim_name:
        kind, name = RESOURCE_CLAIM_TEMPLATES_SUBDIR, pod_claim_name
    else:
        kind, name = RESOURCE_CLAIMS_SUBDIR, claim_name
    return f"{CONTAINER_DIR}/{kind}/{name}/{request}/{driver}{CONTAINER_FILE_SUFFIX}"


def claim_dir_name(namespace: str, name: str) -> str:
    """A claim's directory: `<namespace>_<claimName>`, the claim name shortened where the whole would pass
    NAME_MAX."""
    return f"{namespace}_{bounded_name(name, NAME_MAX - len(namespace.encode()) - 1)}"


def go_json(value: Any) -> str:
    """JSON as Go's `json.MarshalIndent(v, "", "  ")` writes it (what upstream's files and specs are): two-space
    indent, `", "`-free separators, UTF-8 kept, and `<`, `>`, `&`, U+2028, U+2029 escaped. Key order is the
    caller's (Go writes struct fields in declaration order and map keys sorted). The text is
    `json.dumps(value, indent=2, ensure_ascii=False)`'s (tests hold them equal), made by msgspec's C encoder and
    formatter: the stdlib's indenting encoder is pure Python, ≈ 20x slower, and this runs on every prepare."""
    return go_escaped(msgspec.json.format(msgspec.json.encode(value), indent=2).decode())


def _device_json(driver: str, device: DeviceResult) -> dict[str, Any]:
    out: dict[str, Any] = {"driver": driver, "pool": device.pool, "name": device.device}
    metadata = device.metadata
    if metadata is not None and metadata.attributes:
        out["attributes"] = {name: dict(metadata.attributes[name]) for name in sorted(metadata.attributes)}
    if metadata is not None and metadata.network_data is not None:
        net = metadata.network_data
        data: dict[str, Any] = {}
        if net.interface_name:
            data["interfaceName"] = net.interface_name
        if net.ips:
            data["ips"] = list(net.ips)
        if net.hardware_address:
            data["hardwareAddress"] = net.hardware_address
        out["networkData"] = data
    return out


def metadata_document(
    *,
    driver: str,
    claim: ClaimRef,
    pod_claim_name: str | None,
    request: MetadataRequest,
    generation: int = 1,
    versions: Sequence[str] = METADATA_VERSIONS,
) -> bytes:
    """The bytes of a request's metadata.json: one object per version, each followed by a newline."""
    parts = []
    for version in versions:
        obj: dict[str, Any] = {
            "kind": METADATA_KIND,
            "apiVersion": f"{METADATA_GROUP}/{version}",
            "metadata": {"name": claim.name, "namespace": claim.namespace, "uid": claim.uid, "generation": generation},
        }
        if pod_claim_name is not None:
            obj["podClaimName"] = pod_claim_name
        devices = [_device_json(driver, d) for d in request.devices]
        obj["requests"] = [{"name": request.ref, **({"devices": devices} if devices else {})}]
        parts.append(go_json(obj) + "\n")
    return "".join(parts).encode()


def cdi_spec_document(*, driver: str, device_name: str, host_path: str, container_file: str) -> bytes:
    spec = {
        "cdiVersion": CDI_VERSION,
        "kind": f"{driver}/{CDI_CLASS}",
        "devices": [
            {
                "name": device_name,
                "containerEdits": {
                    "mounts": [{"hostPath": host_path, "containerPath": container_file, "options": list(MOUNT_OPTIONS)}]
                },
            }
        ],
    }
    return go_json(spec).encode()


def claim_requests(devices: Sequence[DeviceResult]) -> list[MetadataRequest]:
    """The prepared devices grouped by request (a device serving two requests is in both), in order."""
    grouped: dict[str, tuple[str, list[DeviceResult]]] = {}
    for device in devices:
        refs = device.metadata.request_refs if device.metadata is not None and device.metadata.request_refs else ()
        by_base = {base_request(r): r for r in refs}
        for name in device.request_names:
            ref = by_base.get(name, name)
            entry = grouped.setdefault(name, (ref, []))
            entry[1].append(device)
    return [MetadataRequest(name, ref, tuple(devs)) for name, (ref, devs) in grouped.items()]


class DeviceMetadataWriter:
    """Writes, removes and sweeps the metadata files and CDI specs of one driver on one node."""

    def __init__(
        self,
        *,
        driver_name: str,
        plugin_dir: Path,
        cdi_root: Path,
        versions: Sequence[str] = METADATA_VERSIONS,
        faults: Faults | None = None,
    ) -> None:
        self.driver_name = driver_name
        self.root = plugin_dir.absolute() / METADATA_SUBDIR
        self.cdi_root = cdi_root.absolute()
        # The per-claim writes and removals build their paths as strings from these (no Path per step).
        self._root_s = str(self.root)
        self._cdi_s = str(self.cdi_root)
        self._versions = tuple(versions)
        self._faults = faults or (lambda point: None)
        self._spec_re = re.compile(rf"{re.escape(driver_name)}_{CDI_CLASS}_([A-Za-z0-9-]+)_({_REQUEST_PART})\.json")
        # Temp files of our specs carry a tag of this node's metadata dir: in a CDI dir that several nodes share,
        # the sweep removes only its own interrupted writes.
        self._tag = hashlib.sha256(str(self.root).encode()).hexdigest()[:8]
        self._spec_temp_re = re.compile(
            rf"\.{re.escape(driver_name)}_{CDI_CLASS}_([A-Za-z0-9-]+)_{_REQUEST_PART}\.json\.{self._tag}"
            r"\.[a-z0-9_]{8}\.tmp"
        )
        self._file_temp_re = re.compile(rf"\.{re.escape(METADATA_FILE)}\.[a-z0-9_]{{8}}\.tmp")
        # The spec names this process wrote, by claim UID, until the claim's removal (or a sweep that finds the
        # claim no longer held): the removal unlinks them by name instead of listing the CDI dir, which holds every
        # prepared claim's specs (O(claims held) per unprepare). A claim not here (prepared before a restart, or
        # whose entry a failed removal dropped) is removed by the listing, as before.
        self._written: dict[str, set[str]] = {}
        self._written_lock = threading.Lock()
        self._check_path_room()

    def _check_path_room(self) -> None:
        """Refuse at start a dir in which the longest path this writer can make would pass PATH_MAX (every name
        in it is bounded, so this is the only way a valid claim could fail on a path's length)."""
        longest_file = f"/{'x' * NAME_MAX}/{'x' * REQUEST_NAME_MAX}/.{METADATA_FILE}.12345678.tmp"
        for directory, tail, flag in ((self.root, longest_file, "--plugin-dir"),
                                      (self.cdi_root, f"/{'x' * NAME_MAX}", "--cdi-root")):  # fmt: skip
            size = len(str(directory).encode()) + len(tail)
            if size >= PATH_MAX:
                raise MetadataError(
                    f"{flag}: device metadata paths under {directory} would reach {size} bytes, over the "
                    f"{PATH_MAX - 1}-byte limit on a path; choose a shorter directory"
                )

    # --- paths ---------------------------------------------------------------------------------------

    def claim_dir(self, claim: ClaimRef) -> Path:
        return Path(self._claim_dir(claim))

    def metadata_file(self, claim: ClaimRef, request: str) -> Path:
        return Path(f"{self._claim_dir(claim)}/{request}/{METADATA_FILE}")

    def spec_file(self, claim: ClaimRef, request: str) -> Path:
        """`<driver>_metadata_<claimUID>_<request>.json`, the request name shortened where the name or its temp
        file (`.<name>.<tag>.<random>.tmp`) would pass NAME_MAX; the UID stays whole (removal and the sweep read
        it from the name)."""
        return Path(f"{self._cdi_s}/{self._spec_name(claim, request)}")

    def _claim_dir(self, claim: ClaimRef) -> str:
        return f"{self._root_s}/{claim_dir_name(claim.namespace, claim.name)}"

    def _spec_name(self, claim: ClaimRef, request: str) -> str:
        head = f"{self.driver_name}_{CDI_CLASS}_{claim.uid}_"
        room = ATOMIC_NAME_MAX - len(f".{self._tag}") - len(head.encode()) - len(".json")
        return f"{head}{bounded_name(request, room)}.json"

    def cdi_device_id(self, claim: ClaimRef, request: str) -> str:
        return f"{self.driver_name}/{CDI_CLASS}={claim.uid}_{request}"

    # --- writing ---------------------------------------------------------------------------------------

    def write(self, claim: ClaimRef, pod_claim_name: str | None, devices: Sequence[DeviceResult]) -> dict[str, str]:
        """Write every request's file, then its spec; returns request -> CDI id. Raises MetadataError."""
        if pod_claim_name:
            problem = dns1123_label_problem(pod_claim_name)
            if problem is not None:
                raise MetadataError(
                    f"annotation resource.kubernetes.io/pod-claim-name: {problem}; it must be the pod's claim name "
                    "(pod.spec.resourceClaims[].name), as the ResourceClaim controller sets it"
                )
        ids: dict[str, str] = {}
        claim_dir = self._claim_dir(claim)
        claim_dir_made = False
        for request in claim_requests(devices):
            problem = dns1123_label_problem(request.name)
            if problem is not None:
                raise MetadataError(f"request name {problem}; a request name is a DNS label")
            request_dir = f"{claim_dir}/{request.name}"
            target = f"{request_dir}/{METADATA_FILE}"
            data = metadata_document(
                driver=self.driver_name, claim=claim, pod_claim_name=pod_claim_name, request=request,
                versions=self._versions,
            )  # fmt: skip
            if not claim_dir_made:
                self._make_dir(claim_dir)
                claim_dir_made = True
            fresh = self._make_dir(request_dir)
            self._write(target, data, "the device metadata dir (under --plugin-dir)", fresh=fresh)
            self._faults("metadata:after-file")
            spec = cdi_spec_document(
                driver=self.driver_name,
                device_name=f"{claim.uid}_{request.name}",
                host_path=target,
                container_file=container_path(self.driver_name, claim.name, pod_claim_name, request.name),
            )
            # A fresh request dir means no file of this request existed, so neither did its spec (written after the
            # file, removed before it) but for a crash's leftover, which the write replaces: nothing to compare.
            spec_name = self._spec_name(claim, request.name)
            with self._written_lock:  # noted before the write: a write that fails after its rename is removed too
                self._written.setdefault(claim.uid, set()).add(spec_name)
            self._write_spec(spec_name, spec, fresh=fresh)
            self._faults("metadata:after-spec")
            ids[request.name] = self.cdi_device_id(claim, request.name)
        return ids

    def _make_dir(self, path: str, *, parents: bool = True) -> bool:
        """`path` (and, at a claim's first prepare on a new plugin dir, its missing parents), 0755 whatever the
        umask; True when this call made it. The claim's dir, then each request's: one mkdir each on the usual
        prepare and no failing one (the parents are looked at only when a mkdir answers ENOENT)."""
        try:
            os.mkdir(path, DIR_MODE)
        except FileExistsError:
            return False
        except FileNotFoundError:
            parent = os.path.dirname(path)
            if not parents or parent == path:
                raise MetadataError(f"the device metadata dir {path}: its parent does not exist") from None
            self._make_dir(parent)
            return self._make_dir(path, parents=False)
        except OSError as exc:
            raise MetadataError(explain_os_error(exc, Path(path), "creating", "the device metadata dir")) from exc
        try:
            os.chmod(path, DIR_MODE)  # not the umask's choice
        except OSError as exc:
            raise MetadataError(explain_os_error(exc, Path(path), "creating", "the device metadata dir")) from exc
        return True

    def _write(self, path: str, data: bytes, hint: str, *, fresh: bool = False) -> None:
        """`fresh`: the file's dir was made just now, so there is no file to compare with. Atomic (a temp file
        renamed into place) but not fsynced, file nor dir: see the module's doc, "crash safety"."""
        try:
            if not fresh and _holds(path, data):
                return  # a repeated prepare: the file is already what it would become
            rename_into_place(write_temp_file(path, data, FILE_MODE, durable=False), path)
        except OSError as exc:
            raise MetadataError(explain_os_error(exc, Path(path), "writing", hint)) from exc

    def _write_spec(self, name: str, data: bytes, *, fresh: bool = False) -> None:
        """The spec `name` in the CDI dir; its temp file carries this node's tag (see `__init__`)."""
        path = f"{self._cdi_s}/{name}"
        try:
            if not fresh and _holds(path, data):
                return
            tmp = write_temp_file(f"{path}.{self._tag}", data, FILE_MODE)
            rename_into_place(tmp, path)
            fsync_dir(self._cdi_s)
        except OSError as exc:
            raise MetadataError(explain_os_error(exc, Path(path), "writing", "the CDI spec dir (--cdi-root)")) from exc

    # --- removing --------------------------------------------------------------------------------------

    def remove(self, claim: ClaimRef) -> None:
        """Remove the claim's specs, then its files (only those that name its UID). Idempotent."""
        with self._written_lock:
            written = self._written.pop(claim.uid, None)
        try:
            if written is not None:
                for name in written:
                    _unlink(f"{self._cdi_s}/{name}")
            else:
                self._remove_specs_listed(claim)
            claim_dir = self._claim_dir(claim)
            for request_dir in _subdir_paths(claim_dir):
                if _file_uid(f"{request_dir}/{METADATA_FILE}") in (claim.uid, None):
                    _remove_request_dir(request_dir)
            _rmdir_if_empty(claim_dir)
        except OSError as exc:
            raise MetadataError(f"removing the device metadata of {claim.namespace}/{claim.name}: {exc}") from exc

    def _remove_specs_listed(self, claim: ClaimRef) -> None:
        """The claim's specs found by listing the CDI dir. Names, not Paths, are listed: the CDI dir holds every
        prepared claim's specs (and other drivers'), and a Path per entry was most of an unprepare's CPU at 64
        claims held. A UID has no "_", so the prefix selects exactly the names whose UID group is the claim's."""
        head = f"{self.driver_name}_{CDI_CLASS}_{claim.uid}_"
        for name in _names(self._cdi_s):
            if name.startswith(head) and self._spec_re.fullmatch(name) is not None:
                _unlink(f"{self._cdi_s}/{name}")

    def sweep(self, held: Callable[[], Collection[ClaimRef]], *, temp_files: bool = False) -> list[Path]:
        """Remove what no claim in `held()` owns: specs (ours by their host path), request dirs whose file names
        another UID or none, and the temp files of their interrupted writes. `held` is asked after the listing (see
        the module docstring). `temp_files`: also the temp files of held claims, which only a crash leaves when no
        write of this process can be in flight (at start, before the sockets). Returns what was removed."""
        specs = self._list_specs()
        request_dirs = [(c, r) for c in _subdirs(self.root) for r in _subdirs(c)]
        claims = held()
        uids = {c.uid for c in claims}
        names = {self.claim_dir(c).name for c in claims}
        with self._written_lock:  # a claim no longer held is never removed by an unprepare: forget its names
            for gone in [known for known in self._written if known not in uids]:
                del self._written[gone]
        removed: list[Path] = []
        for path, spec_uid, is_temp in specs:
            if (spec_uid not in uids or (is_temp and temp_files)) and _unlink(path):
                removed.append(path)
        for claim_dir, request_dir in request_dirs:
            uid = _file_uid(request_dir / METADATA_FILE)
            if uid in uids or (uid is None and claim_dir.name in names):
                for temp in _files(request_dir) if temp_files else ():
                    if self._file_temp_re.fullmatch(temp.name) and _unlink(temp):
                        removed.append(temp)
                continue
            shutil.rmtree(request_dir, ignore_errors=True)
            removed.append(request_dir)
        for claim_dir in {c for c, _ in request_dirs}:
            if claim_dir.name not in names:
                _rmdir_if_empty(claim_dir)
        if removed:
            log.info("removed device metadata no prepared claim owns", paths=[str(p) for p in removed])
        return removed

    def _list_specs(self) -> list[tuple[Path, str, bool]]:
        """Our specs and spec temp files, with the claim UID each is for and whether it is a temp file."""
        out: list[tuple[Path, str, bool]] = []
        try:
            entries = list(os.scandir(self.cdi_root))
        except FileNotFoundError:
            return out
        for entry in entries:
            temp = self._spec_temp_re.fullmatch(entry.name)
            if temp is not None:
                out.append((Path(entry.path), temp.group(1), True))
                continue
            match = self._spec_re.fullmatch(entry.name)
            if match is not None and self._mounts_ours(Path(entry.path)):
                out.append((Path(entry.path), match.group(1), False))
        return out

    def _mounts_ours(self, spec: Path) -> bool:
        try:
            doc = json.loads(spec.read_bytes())
            mounts = doc["devices"][0]["containerEdits"]["mounts"]
            return all(Path(str(m["hostPath"])).is_relative_to(self.root) for m in mounts) and bool(mounts)
        except (OSError, ValueError, KeyError, IndexError, TypeError):
            return False  # not a spec this writer made (or not readable): never ours to remove


def _subdirs(directory: Path) -> list[Path]:
    return [Path(path) for path in _subdir_paths(str(directory))]


def _files(directory: Path) -> list[Path]:
    try:
        return [Path(e.path) for e in os.scandir(directory) if e.is_file(follow_symlinks=False)]
    except (FileNotFoundError, NotADirectoryError):
        return []


def _subdir_paths(directory: str) -> list[str]:
    """The subdirectories of `directory` (not following links), as strings (the unprepare's form); none when it is
    missing."""
    try:
        with os.scandir(directory) as entries:
            return [e.path for e in entries if e.is_dir(follow_symlinks=False)]
    except (FileNotFoundError, NotADirectoryError):
        return []


def _holds(path: str, data: bytes) -> bool:
    """Whether the regular file `path` holds exactly `data` (False when it is missing or not a file)."""
    try:
        with open(path, "rb") as file:
            if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
                return False
            return file.read() == data
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return False


def _names(directory: str | Path) -> list[str]:
    try:
        return os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []


def _remove_request_dir(request_dir: str) -> None:
    """The request's file, then its dir; whatever else is in it (an interrupted write's temp file) by rmtree."""
    with contextlib.suppress(OSError):  # not a plain file (or gone): rmtree below takes what is there
        os.unlink(f"{request_dir}/{METADATA_FILE}")
    try:
        os.rmdir(request_dir)
    except FileNotFoundError:
        return
    except OSError:
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(request_dir)


class _FileClaim(msgspec.Struct, frozen=True):
    uid: Any = None


class _FileHead(msgspec.Struct, frozen=True):
    """Of a metadata file's object, only what an unprepare reads (msgspec skips the rest without building it)."""

    metadata: _FileClaim | None = None


_FILE_HEAD = msgspec.json.Decoder(_FileHead)


def _file_uid(path: str | Path) -> str | None:
    """The claim UID the first object of a metadata file names; None when there is no readable one. A file of one
    object (one version, what this plugin writes today) is decoded for its UID alone; a stream of several, or
    anything msgspec refuses, by the standard library's stream decoder."""
    try:
        with open(path, "rb") as file:
            raw = file.read()
    except OSError:
        return None
    try:
        head = _FILE_HEAD.decode(raw).metadata
        uid = head.uid if head is not None else None
    except msgspec.DecodeError:  # several objects (trailing data), or not one this view reads
        try:
            first, _ = json.JSONDecoder().raw_decode(raw.decode("utf-8").lstrip())
            uid = first["metadata"]["uid"]
        except (ValueError, KeyError, TypeError):
            return None
    return uid if isinstance(uid, str) else None


def _unlink(path: str | Path) -> bool:
    """Remove `path`, not durably: a spec or file a machine crash brings back names a claim the checkpoint no longer
    holds, and the sweep at start removes it before the plugin serves (docs/architecture.md "Durable files")."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


def _rmdir_if_empty(directory: str | Path) -> None:
    with contextlib.suppress(FileNotFoundError, OSError):
        os.rmdir(directory)


class MetadataFiles:
    """The prepare pipeline's device-metadata observer (pipeline.py; see the module docstring): after the engine
    prepared a claim it writes the files and adds their CDI ids to the answer, after the engine unprepared one it
    removes them; a claim whose files cannot be written or removed gets that as its error.

    `enabled` may change once (the plugin resolves `--device-metadata auto` from the API server's version):
    while off, nothing is written, but unprepare and the sweep still remove what an earlier run wrote."""

    def __init__(self, writer: DeviceMetadataWriter, *, enabled: bool = True) -> None:
        self.writer = writer
        self.enabled = enabled

    def prepared(self, outcomes: Sequence[PrepareOutcome]) -> dict[str, PrepareResult]:
        if not self.enabled:
            return {}
        prepared = (o for o in outcomes if not o.result.error and o.result.devices)
        return {o.ref.uid: self._with_metadata(o.ref, o.result) for o in prepared}

    def _with_metadata(self, claim: ClaimRef, result: PrepareResult) -> PrepareResult:
        try:
            ids = self.writer.write(claim, result.pod_claim_name, result.devices)
        except MetadataError as exc:
            log.warning("writing device metadata failed", claim=f"{claim.namespace}/{claim.name}", error=str(exc))
            return PrepareResult(error=f"prepare {claim.namespace}/{claim.name}: device metadata: {exc}")
        except Exception as exc:  # a bug fails this claim, never the other claims of the kubelet's call
            log.exception("writing device metadata failed unexpectedly", claim=f"{claim.namespace}/{claim.name}",
                          claim_uid=claim.uid)  # fmt: skip
            return PrepareResult(
                error=f"prepare {claim.namespace}/{claim.name}: device metadata: internal error: {exc}"
            )
        return _inject(result, ids)

    def unprepared(self, outcomes: Sequence[UnprepareOutcome]) -> dict[str, str]:
        errors: dict[str, str] = {}
        for claim in (o.ref for o in outcomes if not o.error):
            try:
                self.writer.remove(claim)
            except MetadataError as exc:
                errors[claim.uid] = f"unprepare {claim.namespace}/{claim.name}: device metadata: {exc}"
            except Exception as exc:  # as in prepare: this claim's error only
                log.exception("removing device metadata failed unexpectedly", claim=f"{claim.namespace}/{claim.name}",
                              claim_uid=claim.uid)  # fmt: skip
                errors[claim.uid] = f"unprepare {claim.namespace}/{claim.name}: device metadata: internal error: {exc}"
        return errors


def _inject(result: PrepareResult, ids: Mapping[str, str]) -> PrepareResult:
    """Each request's metadata CDI id on the first device of that request (as upstream's helper does)."""
    pending = dict(ids)
    devices = []
    for device in result.devices:
        extra = tuple(pending.pop(name) for name in device.request_names if name in pending)
        devices.append(replace(device, cdi_device_ids=(*device.cdi_device_ids, *extra)) if extra else device)
    return replace(result, devices=tuple(devices))
