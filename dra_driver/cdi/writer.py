"""Writing CDI spec files atomically (temp file in the same dir, fsync, rename) with mode 0644.

Runtimes read spec directories at any moment, so a reader must see either the old file or the whole
new one, never a partial write. The spec is validated before anything touches the disk.
"""

from __future__ import annotations

import re
from pathlib import Path

from dra_driver.cdi.encode import spec_to_json
from dra_driver.cdi.errors import CdiError
from dra_driver.cdi.model import Spec
from dra_driver.cdi.names import validate_class, validate_vendor
from dra_driver.cdi.validate import validate_spec
from dra_driver.fsutil import GroupCommit, atomic_write, explain_os_error, fsync_dir

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


def encode_spec(spec: Spec) -> bytes:
    """Validate `spec` and return exactly the bytes `write_spec` writes for it (to compare with a file on disk)."""
    validate_spec(spec)
    return spec_to_json(spec).encode()


def write_spec(directory: Path, file_name: str, spec: Spec, commit: GroupCommit | None = None) -> Path:
    """Validate `spec` and write it as JSON to `directory/file_name` atomically; returns the path. With `commit`,
    the write joins that group commit (concurrent writers share the flush)."""
    if "/" in file_name or not file_name.endswith(".json"):
        raise CdiError("file_name", f"{file_name!r} must be a bare file name ending in .json")
    data = encode_spec(spec)
    directory.mkdir(mode=SPEC_DIR_MODE, parents=True, exist_ok=True)
    target = directory / file_name
    if commit is not None:
        commit.write(target, data, mode=SPEC_FILE_MODE)
    else:
        atomic_write(target, data, mode=SPEC_FILE_MODE)
    return target


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


def remove_spec(directory: Path, file_name: str) -> bool:
    """Delete a spec file; False when it was already gone (unprepare must be idempotent)."""
    try:
        (directory / file_name).unlink()
    except FileNotFoundError:
        return False
    fsync_dir(directory)
    return True
