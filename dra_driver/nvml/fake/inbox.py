"""Cross-process event injection for a state-file-backed fake: `<state>.events`, one JSON object a line.

A test (or `make demo`) appends Xid / ECC / lost-GPU events for a fake node that runs in another process (the
kubelet plugin); that process's `wait_event` picks them up. Like NVML, a process only sees events posted after
it opened the fake.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dra_driver.nvml.types import EVENT_DOUBLE_BIT_ECC, EVENT_XID_CRITICAL, NO_INSTANCE


def inbox_path(state_path: Path | str) -> Path:
    return Path(f"{state_path}.events")


def post_event(
    state_path: Path | str,
    gpu_uuid: str,
    *,
    xid: int | None = None,
    double_bit_ecc: bool = False,
    lost: bool = False,
    gi: int | None = None,
    ci: int | None = None,
) -> None:
    """Append one event for the fake node using `state_path` (exactly one of xid / double_bit_ecc / lost)."""
    if sum((xid is not None, double_bit_ecc, lost)) != 1:
        raise ValueError("post_event: give exactly one of xid=, double_bit_ecc=True, lost=True")
    record: dict[str, Any] = {"gpu": gpu_uuid}
    if lost:
        record["lost"] = True
    elif double_bit_ecc:
        record["type"] = EVENT_DOUBLE_BIT_ECC
    else:
        record.update(type=EVENT_XID_CRITICAL, data=xid)
    record["gi"] = NO_INSTANCE if gi is None else gi
    record["ci"] = NO_INSTANCE if ci is None else ci
    line = (json.dumps(record) + "\n").encode()
    # O_APPEND: concurrent writers never interleave a line this short.
    fd = os.open(inbox_path(state_path), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


@dataclass
class Inbox:
    """The reading side: remembers how far this process has read."""

    path: Path
    offset: int = 0

    @classmethod
    def at_end(cls, state_path: Path | str) -> Inbox:
        path = inbox_path(state_path)
        return cls(path, path.stat().st_size if path.exists() else 0)

    def read_new(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                data = handle.read()
        except FileNotFoundError:
            return []
        complete = data[: data.rfind(b"\n") + 1]
        self.offset += len(complete)
        return [json.loads(line) for line in complete.splitlines() if line.strip()]
