"""Cross-process event injection into a state-file-backed fake (the plugin runs in another process)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dra_driver.nvml.factory import open_backend
from dra_driver.nvml.fake.inbox import post_event
from dra_driver.nvml.types import EVENT_DOUBLE_BIT_ECC, EVENT_XID_CRITICAL, NvmlError, NvmlReturn


def test_events_posted_by_another_process_reach_wait_event(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    fake = open_backend(f"fake:dgx-h100,state={state}")
    fake.init()
    gpus = [g.uuid for g in fake.gpus()]
    post_event(state, gpus[0], xid=31)  # before registration: lost, as with NVML
    fake.register_events(gpus, EVENT_XID_CRITICAL | EVENT_DOUBLE_BIT_ECC)
    assert fake.wait_event(0) is None
    script = (
        "from dra_driver.nvml.fake.inbox import post_event\n"
        f"post_event({str(state)!r}, {gpus[1]!r}, xid=79)\n"
        f"post_event({str(state)!r}, {gpus[2]!r}, double_bit_ecc=True)\n"
        f"post_event({str(state)!r}, {gpus[3]!r}, lost=True)\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    first = fake.wait_event(2000)
    assert first is not None and (first.gpu_uuid, first.data) == (gpus[1], 79)
    second = fake.wait_event(2000)
    assert second is not None and second.event_type == EVENT_DOUBLE_BIT_ECC
    with pytest.raises(NvmlError) as lost:
        fake.wait_event(2000)
    assert lost.value.code is NvmlReturn.GPU_IS_LOST
    assert fake.wait_event(0) is None


def test_post_event_wants_exactly_one_kind(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="exactly one"):
        post_event(tmp_path / "s.json", "GPU-x", xid=79, lost=True)
