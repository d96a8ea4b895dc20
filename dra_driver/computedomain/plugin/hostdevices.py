"""The host's character devices a compute-domain claim gets: the IMEX channels and the fabric-management
capability, as the kernel numbers them.

- IMEX channel N is `/dev/nvidia-caps-imex-channels/channel<N>`: char major = the `/proc/devices` entry
  `nvidia-caps-imex-channels` (dynamic, so read, never assumed), minor N.
- The fabric-management capability (what an IMEX daemon needs) is `/dev/nvidia-caps/nvidia-cap<M>`: major = the
  `/proc/devices` entry `nvidia-caps`, M = `DeviceFileMinor:` in `/proc/driver/nvidia/capabilities/fabric-imex-mgmt`.
The CDI edits name type, major and minor explicitly: the channel nodes need not exist on the host for the runtime
to create them in the container.

On the fake NVML there is no NVIDIA kernel module: `write_fake_proc` lays out a `proc` tree with those entries
(FAKE_* numbers) under the plugin's state, and the plugin reads it through the same code (`--proc-root`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from dra_driver.computedomain.names import CHANNEL_MAJOR_NAME, FABRIC_MGMT_CAPABILITY
from dra_driver.errors import DraDriverError
from dra_driver.fsutil import atomic_write

CAPS_MAJOR_NAME = "nvidia-caps"
CAPS_DEVICE_DIR = "/dev/nvidia-caps"
# The fake tree's numbers: majors from the dynamic range Linux hands out (234-254), a capability minor as the
# driver gives the fabric-management one on GB200 nodes.
FAKE_CHANNEL_MAJOR = 234
FAKE_CAPS_MAJOR = 235
FAKE_FABRIC_MGMT_MINOR = 1


class HostDeviceError(DraDriverError):
    """A device number the plugin needs cannot be read; the message names the file and what to check."""


@dataclass(frozen=True)
class HostDevices:
    """Reads device numbers under `proc_root` (the host's /proc as this process sees it)."""

    proc_root: Path

    def char_major(self, name: str) -> int:
        path = self.proc_root / "devices"
        try:
            text = path.read_text()
        except OSError as exc:
            raise HostDeviceError(f"reading {path}: {exc.strerror or exc}; is --proc-root the host's /proc?") from exc
        in_char = False
        for line in text.splitlines():
            if line.strip() == "Character devices:":
                in_char = True
                continue
            if line.strip() == "Block devices:":
                in_char = False
                continue
            parts = line.split()
            if in_char and len(parts) == 2 and parts[1] == name and parts[0].isdigit():
                return int(parts[0])
        raise HostDeviceError(
            f"{path} has no character device {name!r}; is the NVIDIA driver loaded (with IMEX channel support: "
            "driver 550 or later on an NVLink-fabric node)?"
        )

    def channel_major(self) -> int:
        return self.char_major(CHANNEL_MAJOR_NAME)

    def fabric_mgmt_minor(self) -> int:
        path = self.proc_root / Path(FABRIC_MGMT_CAPABILITY).relative_to("/proc")
        try:
            text = path.read_text()
        except OSError as exc:
            raise HostDeviceError(
                f"reading {path}: {exc.strerror or exc}; the IMEX daemon needs the fabric-management capability "
                "(an NVLink-fabric node's driver provides it)"
            ) from exc
        match = re.search(r"DeviceFileMinor:\s*(\d+)", text)
        if match is None:
            raise HostDeviceError(f"{path} names no DeviceFileMinor")
        return int(match.group(1))


def write_fake_proc(root: Path) -> Path:
    """The fake NVML's `proc` tree (idempotent); returns `root`."""
    (root / Path(FABRIC_MGMT_CAPABILITY).relative_to("/proc")).parent.mkdir(parents=True, exist_ok=True)
    atomic_write(
        root / "devices",
        (f"Character devices:\n  1 mem\n195 nvidia-frontend\n{FAKE_CHANNEL_MAJOR} {CHANNEL_MAJOR_NAME}\n"
         f"{FAKE_CAPS_MAJOR} {CAPS_MAJOR_NAME}\n\nBlock devices:\n  8 sd\n").encode(),
        mode=0o644,
    )
    atomic_write(
        root / Path(FABRIC_MGMT_CAPABILITY).relative_to("/proc"),
        f"DeviceFileMinor: {FAKE_FABRIC_MGMT_MINOR}\nDeviceFileMode: 256\nDeviceFileModify: 1\n".encode(),
        mode=0o644,
    )
    return root
