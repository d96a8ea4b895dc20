"""A driver's per-claim CDI spec files on this node, whatever it puts in them.

One transient spec per claim, `<cdi-root>/k8s.<driver>-claim_<node>_<claimUID>.json`, kind `k8s.<driver>/claim`,
one CDI device per prepared device named `<claimUID>-<device>`. The node name in the file name lets the orphan
sweep touch only this node's files where several nodes share a CDI dir (the sandbox, or a runtime dir on shared
storage); it is shortened where the name would pass the 255-byte limit (`cdi.writer.node_claim_spec_name`).
Each driver builds the spec (the GPU driver's `plugin.cdi.ClaimSpecWriter`, the ComputeDomain driver's
`computedomain.plugin.cdi.SpecFiles`); this class names, writes, compares, lists and removes the files.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path

from dra_driver.cdi.errors import CdiSpecError
from dra_driver.cdi.model import Spec
from dra_driver.cdi.names import qualified_name
from dra_driver.cdi.writer import (
    CDI_ROOT_HINT,
    node_claim_spec_name,
    node_claim_spec_uid,
    remove_spec,
    spec_file_problem,
    write_spec_file,
)
from dra_driver.fsutil import GroupCommit, explain_os_error, sweep_temp_files, temp_file_pattern

CLAIM_CLASS = "claim"
_NO_WRITE_ACCESS = (errno.EROFS, errno.EACCES, errno.EPERM)


def cdi_vendor(driver_name: str) -> str:
    return f"k8s.{driver_name}"


def cdi_device_name(claim_uid: str, device_name: str) -> str:
    return f"{claim_uid}-{device_name}"


class ClaimSpecFiles:
    """The only writer of one driver's claim spec files on this node."""

    def __init__(
        self,
        cdi_root: Path,
        driver_name: str,
        node_name: str,
        is_uid: Callable[[str], bool],
        commit: GroupCommit | None = None,
        *,
        defer_sync: bool = False,
    ) -> None:
        """`defer_sync`: a write leaves its directory entry to `fsutil.sync_deferred(cdi_root)`, which the owner
        must call before it answers for the spec, and a removal its unlink to the next fsync of the directory; only
        for a driver whose startup sweep removes specs no record owns (docs/architecture.md "Durable files").
        Otherwise every write and removal is durable when it returns (with `commit`, concurrent writes share one
        directory fsync)."""
        self.cdi_root = cdi_root
        self._root = os.fspath(cdi_root)  # the per-claim writes and removals work on strings (no Path per claim)
        self.vendor = cdi_vendor(driver_name)
        self.node_name = node_name
        # Our temp files: `.<spec file name>.<random>.tmp` (see fsutil.atomic_write).
        self._temp_re = temp_file_pattern(r"(?P<target>.+)")
        self._is_uid = is_uid  # what the kubelet may send as a claim UID: a file named otherwise is not ours
        self._commit = commit  # concurrent writes share one directory fsync where given
        self._defer_sync = defer_sync

    @property
    def kind(self) -> str:
        return f"{self.vendor}/{CLAIM_CLASS}"

    def file_name(self, claim_uid: str) -> str:
        return node_claim_spec_name(self.vendor, CLAIM_CLASS, self.node_name, claim_uid)

    def _claim_uid(self, file_name: str) -> str | None:
        """The UID of the claim whose spec (of this driver and node) has this name; None for any other file."""
        uid = node_claim_spec_uid(file_name, self.vendor, CLAIM_CLASS, self.node_name)
        return uid if uid is not None and self._is_uid(uid) else None

    def spec_path(self, claim_uid: str) -> Path:
        return self.cdi_root / self.file_name(claim_uid)

    def cdi_id(self, claim_uid: str, device_name: str) -> str:
        return qualified_name(self.vendor, CLAIM_CLASS, cdi_device_name(claim_uid, device_name))

    def write_spec(self, claim_uid: str, spec: Spec) -> None:
        try:
            write_spec_file(self._root, self.file_name(claim_uid), spec, self._commit, defer_sync=self._defer_sync)
        except OSError as exc:
            raise CdiSpecError(
                explain_os_error(exc, self.spec_path(claim_uid), "writing the CDI spec", CDI_ROOT_HINT)
            ) from exc

    def spec_problem(self, claim_uid: str, spec: Spec) -> str | None:
        """None when the claim's spec file holds exactly `spec`; else what is wrong (missing, truncated, edited,
        or stale because what the driver writes changed)."""
        return spec_file_problem(self.spec_path(claim_uid), spec)

    def remove(self, claim_uid: str) -> bool:
        try:
            return remove_spec(self._root, self.file_name(claim_uid), durable=not self._defer_sync)
        except OSError as exc:
            if exc.errno in _NO_WRITE_ACCESS and not os.path.lexists(self.spec_path(claim_uid)):
                # Nothing to remove needs no write access (a read-only dir answers EROFS even for a missing file);
                # looked at only then, not before every unlink.
                return False
            raise CdiSpecError(
                explain_os_error(exc, self.spec_path(claim_uid), "removing the CDI spec", CDI_ROOT_HINT)
            ) from exc

    def claim_uids_on_disk(self) -> set[str]:
        """UIDs of the claims that have a spec file of ours (this driver, this node) in the CDI dir."""
        if not self.cdi_root.is_dir():
            return set()
        found = set()
        for path in self.cdi_root.iterdir():
            uid = self._claim_uid(path.name)
            if uid is not None and path.is_file():
                found.add(uid)
        return found

    def sweep_temp_files(self) -> list[Path]:
        """Delete temp files a crash left mid-write of one of OUR specs (this driver, this node); other
        drivers' and other nodes' files in a shared CDI dir are never touched. Only while no prepare runs."""
        return sweep_temp_files(self.cdi_root, self._is_our_temp_file)

    def _is_our_temp_file(self, name: str) -> bool:
        match = self._temp_re.fullmatch(name)
        return match is not None and self._claim_uid(match["target"]) is not None
