"""`nvidia-smi compute-policy --set-timeslice`, as the real backend runs it: a real program (a stand-in script),
its exact arguments and environment, and what each exit status becomes."""

from __future__ import annotations

from pathlib import Path

import pytest

from dra_driver.nvml.real.computepolicy import find_nvidia_smi, set_time_slice
from dra_driver.nvml.types import NvmlError, NvmlReturn, TimeSlice

UUID = "GPU-3d3d3d3d-0000-4000-8000-000000000003"


def stand_in(root: Path, exit_status: int, message: str = "") -> Path:
    """An executable nvidia-smi under `root`/usr/bin that records its arguments and LD_PRELOAD."""
    script = root / "usr" / "bin" / "nvidia-smi"
    script.parent.mkdir(parents=True)
    script.write_text(
        '#!/bin/sh\necho "$@" > "$0.args"\necho "$LD_PRELOAD" > "$0.preload"\n'
        f'echo "{message}" >&2\nexit {exit_status}\n'
    )
    script.chmod(0o755)
    return script


def test_finds_nvidia_smi_under_the_driver_root(tmp_path: Path) -> None:
    assert find_nvidia_smi(str(tmp_path)) is None
    script = stand_in(tmp_path, 0)
    assert find_nvidia_smi(str(tmp_path)) == str(script)


def test_sets_the_interval_with_the_plugins_libnvidia_ml_preloaded(tmp_path: Path) -> None:
    script = stand_in(tmp_path, 0)
    set_time_slice(str(script), UUID, TimeSlice.MEDIUM, library_path="/driver-root/usr/lib64/libnvidia-ml.so.1")
    assert Path(f"{script}.args").read_text().split() == ["compute-policy", "-i", UUID, "--set-timeslice", "2"]
    assert Path(f"{script}.preload").read_text().strip() == "/driver-root/usr/lib64/libnvidia-ml.so.1"


def test_exit_status_3_is_not_supported_with_what_nvidia_smi_said(tmp_path: Path) -> None:
    script = stand_in(tmp_path, 3, "Failed to set timeslice policy for GPU 00000000:3B:00.0: Not Supported")
    with pytest.raises(NvmlError) as info:
        set_time_slice(str(script), UUID, TimeSlice.LONG, library_path=None)
    assert info.value.code is NvmlReturn.NOT_SUPPORTED
    assert "Failed to set timeslice policy" in str(info.value) and "Not Supported" in str(info.value)


def test_other_failures_are_errors_not_unsupported(tmp_path: Path) -> None:
    script = stand_in(tmp_path, 9, "Insufficient Permissions")
    with pytest.raises(NvmlError) as info:
        set_time_slice(str(script), UUID, TimeSlice.SHORT, library_path=None)
    assert info.value.code is NvmlReturn.UNKNOWN and "Insufficient Permissions" in str(info.value)


def test_no_nvidia_smi_is_not_supported_naming_where_it_looked() -> None:
    with pytest.raises(NvmlError) as info:
        set_time_slice(None, UUID, TimeSlice.SHORT, library_path=None, searched=["/driver-root/usr/bin"])
    assert info.value.code is NvmlReturn.NOT_SUPPORTED and "/driver-root/usr/bin" in str(info.value)
