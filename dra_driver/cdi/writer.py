"""Writing CDI spec files atomically (temp file in the same dir, fsync, rename) with mode 0644.

Runtimes read spec directories at any moment, so a reader must see either the old file or the whole
new one, never a partial write. The spec is validated before anything touches the disk.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from dra_driver.cdi.encode import spec_to_json
from dra_driver.cdi.errors import CdiError
from dra_driver.cdi.model import Spec
from dra_driver.cdi.names import validate_class, validate_vendor
from dra_driver.cdi.validate import validate_spec
from dra_driver.fsutil import (
    ATOMIC_NAME_MAX,
    GroupCommit,
    StrPath,
    atomic_write,
    bounded_name,
    defer_dir_sync,
    explain_os_error,
    fsync_dir,
    rename_into_place,
    write_temp_file,
)

SPEC_FILE_MODE = 0o644
SPEC_DIR_MODE = 0o755
_UNSAFE_RE = re.compile(r"[^A-Za-z0-9_.:-]")


def spec_file_name(vendor: str, device_class: str, transient_id: str | None = None, ext: str = ".json") -> str:
    """``<vendor>-<class>[_<id>].json`` (the CDI library's convention; '/' in the id becomes '_')."""
    validate_vendor(vendor, "vendor")
    validate_class(device_class, "class")
    if ext not in (".json", ".yaml"):
        raise CdiError("ext", f"{ext!r}: CDI spec files must end in .json or .yaml")
    name = f"{vendor}-{device_class}"
    if transient_id is not None:
        if not transient_id:
            raise CdiError("transient_id", "is empty; use e.g. the claim UID")
        # '/' per the library; any other character that is unsafe in a file name is replaced too.
        name += "_" + _UNSAFE_RE.sub("_", transient_id.replace("/", "_"))
    return name + ext


def node_claim_spec_name(vendor: str, device_class: str, node: str, claim_uid: str) -> str:
    """`<vendor>-<class>_<node>_<claimUID>.json`, a claim's spec on one node (the node name lets a sweep keep to its
    own node's files in a shared CDI dir). Where the name or its temp file would pass the 255-byte limit (a node
    name may be 253 bytes), the node name is shortened (`fsutil.bounded_name`); the UID stays whole, so the claim
    is read back from the name (`node_claim_spec_uid`). A name that fits is the name earlier versions wrote."""
    room = ATOMIC_NAME_MAX - len(f"{vendor}-{device_class}_".encode()) - len(f"_{claim_uid}.json".encode())
    return spec_file_name(vendor, device_class, f"{bounded_name(node, room)}_{claim_uid}")


def node_claim_spec_uid(file_name: str, vendor: str, device_class: str, node: str) -> str | None:
    """The claim UID of a file `node_claim_spec_name` names for this node; None for any other name (another
    driver's, another node's, a foreign file). The caller still checks that the UID is one."""
    head = f"{vendor}-{device_class}_"
    if not (file_name.startswith(head) and file_name.endswith(".json")):
        return None
    _, sep, uid = file_name[len(head) : -len(".json")].rpartition("_")
    if not sep or not uid:
        return None
    try:
        return uid if node_claim_spec_name(vendor, device_class, node, uid) == file_name else None
    except (CdiError, ValueError):  # no room left for this node's name beside a UID this long: not ours
        return None


def encode_spec(spec: Spec) -> bytes:
    """Validate `spec` and return exactly the bytes `write_spec` writes for it (to compare with a file on disk)."""
    validate_spec(spec)
    return spec_to_json(spec).encode()


def write_spec(
    directory: Path, file_name: str, spec: Spec, commit: GroupCommit | None = None, *, defer_sync: bool = False
) -> Path:
    """Validate `spec` and write it as JSON to `directory/file_name` atomically; returns the path. With `commit`,
    the write joins that group commit (concurrent writers share the flush). With `defer_sync`, the file is durable
    and renamed into place but its directory entry is left to the caller's `fsutil.sync_deferred(directory)` (or
    any later fsync of the directory), which must come before the caller relies on it. The directory (and its
    parents) is made only when the write finds it missing: an existing one costs no mkdir."""
    return Path(write_spec_file(os.fspath(directory), file_name, spec, commit, defer_sync=defer_sync))


def write_spec_file(
    directory: str, file_name: str, spec: Spec, commit: GroupCommit | None = None, *, defer_sync: bool = False
) -> str:
    """`write_spec` with the directory and the path it returns as strings: the per-claim writers' form (no Path
    built per write)."""
    if "/" in file_name or not file_name.endswith(".json"):
        raise CdiError("file_name", f"{file_name!r} must be a bare file name ending in .json")
    data = encode_spec(spec)
    target = f"{directory}/{file_name}"
    try:
        _put(directory, target, data, commit, defer_sync)
    except FileNotFoundError:
        os.makedirs(directory, mode=SPEC_DIR_MODE, exist_ok=True)
        _put(directory, target, data, commit, defer_sync)
    return target


def _put(directory: str, target: str, data: bytes, commit: GroupCommit | None, defer_sync: bool) -> None:
    if defer_sync:
        rename_into_place(write_temp_file(target, data, SPEC_FILE_MODE), target)
        defer_dir_sync(directory)
    elif commit is not None:
        commit.write(target, data, mode=SPEC_FILE_MODE)
    else:
        atomic_write(target, data, mode=SPEC_FILE_MODE)


# Where a failed CDI file operation points the admin.
CDI_ROOT_HINT = "the CDI spec dir (--cdi-root)"


def spec_file_problem(path: Path, spec: Spec) -> str | None:
    """None when `path` holds exactly what `write_spec` writes for `spec`; else what is wrong (missing, unreadable,
    truncated or edited, or stale because what the spec would say has changed)."""
    try:
        on_disk = path.read_bytes()
    except FileNotFoundError:
        return f"CDI spec {path} is missing"
    except OSError as exc:
        return explain_os_error(exc, path, "reading the CDI spec", CDI_ROOT_HINT)
    if on_disk != encode_spec(spec):
        return f"CDI spec {path} differs from what this plugin writes for the claim (truncated or edited?)"
    return None


def remove_spec(directory: StrPath, file_name: str, *, durable: bool = True) -> bool:
    """Delete a spec file; False when it was already gone (unprepare must be idempotent). `durable=False` leaves the
    unlink's directory entry to the next fsync of the directory: only for a writer whose startup sweep removes a
    spec that a machine crash brings back (docs/architecture.md "Durable files")."""
    try:
        os.unlink(f"{os.fspath(directory)}/{file_name}")
    except FileNotFoundError:
        return False
    if durable:
        fsync_dir(directory)
    return True
