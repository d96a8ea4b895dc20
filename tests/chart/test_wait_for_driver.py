"""The init container's driver wait (files/wait-for-driver.sh), run with the image's /bin/sh (dash)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.chart.helm import CHART, Helm, one

SCRIPT = CHART / "files" / "wait-for-driver.sh"
SHELL = shutil.which("dash") or "/bin/sh"


def run(env: dict[str, str], timeout: float = 20) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SHELL, str(SCRIPT)],
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture
def roots(tmp_path: Path) -> tuple[Path, Path]:
    driver_root, dev_root = tmp_path / "driver-root", tmp_path / "dev"
    driver_root.mkdir()
    dev_root.mkdir()
    return driver_root, dev_root


def install_library(driver_root: Path) -> Path:
    lib_dir = driver_root / "usr/lib/x86_64-linux-gnu"
    lib_dir.mkdir(parents=True)
    (lib_dir / "libnvidia-ml.so.580.105.08").write_bytes(b"\x7fELF")
    (lib_dir / "libnvidia-ml.so.1").symlink_to("libnvidia-ml.so.580.105.08")
    return lib_dir / "libnvidia-ml.so.1"


def install_nvidiactl(dev_root: Path) -> Path:
    # A symlink to /dev/null is a real character device for `[ -c ]`; no mknod (root) needed.
    (dev_root / "nvidiactl").symlink_to("/dev/null")
    return dev_root / "nvidiactl"


def env_for(driver_root: Path, dev_root: Path, **extra: str) -> dict[str, str]:
    return {"DRIVER_ROOT": str(driver_root), "DEV_ROOT": str(dev_root), "HOST_DRIVER_ROOT": "/", **extra}


def test_ready_driver_passes_at_once(roots: tuple[Path, Path]) -> None:
    driver_root, dev_root = roots
    lib, ctl = install_library(driver_root), install_nvidiactl(dev_root)
    proc = run(env_for(driver_root, dev_root))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"NVIDIA driver ready: {lib} and {ctl}" in proc.stdout


def test_nvidiactl_under_the_driver_root_also_counts(roots: tuple[Path, Path]) -> None:
    driver_root, dev_root = roots
    install_library(driver_root)
    (driver_root / "dev").mkdir()
    install_nvidiactl(driver_root / "dev")
    assert run(env_for(driver_root, dev_root, CHECK_ONCE="1")).returncode == 0


def test_missing_driver_names_paths_and_both_driver_root_settings(roots: tuple[Path, Path]) -> None:
    driver_root, dev_root = roots
    proc = run(env_for(driver_root, dev_root, CHECK_ONCE="1"))
    assert proc.returncode == 1
    out = proc.stdout
    assert f"MISSING libnvidia-ml.so.1 (not found) under {driver_root} (= / on the node)" in out
    assert f"{driver_root}/usr/lib/x86_64-linux-gnu/" in out and f"{driver_root}/usr/lib64/" in out
    assert f"MISSING character device nvidiactl; looked at {dev_root}/nvidiactl" in out
    assert "--set driverRoot=/run/nvidia/driver" in out  # GPU Operator
    assert "--set driverRoot=/" in out  # host-installed driver
    assert "The chart value driverRoot is '/'" in out
    assert "modprobe nvidia" in out
    assert "nvml=fake:" in out


def test_only_the_kernel_module_missing(roots: tuple[Path, Path]) -> None:
    driver_root, dev_root = roots
    install_library(driver_root)
    proc = run(env_for(driver_root, dev_root, CHECK_ONCE="1"))
    assert proc.returncode == 1
    assert "MISSING libnvidia-ml" not in proc.stdout
    assert "MISSING character device nvidiactl" in proc.stdout


def test_dangling_library_symlink_is_explained(roots: tuple[Path, Path]) -> None:
    driver_root, dev_root = roots
    install_nvidiactl(dev_root)
    lib_dir = driver_root / "usr/lib64"
    lib_dir.mkdir(parents=True)
    (lib_dir / "libnvidia-ml.so.1").symlink_to("/usr/lib64/libnvidia-ml.so.999")
    proc = run(env_for(driver_root, dev_root, CHECK_ONCE="1"))
    assert proc.returncode == 1
    assert f"{lib_dir}/libnvidia-ml.so.1 is a dangling symlink (-> /usr/lib64/libnvidia-ml.so.999)" in proc.stdout


def test_waits_until_the_driver_appears(roots: tuple[Path, Path]) -> None:
    driver_root, dev_root = roots
    install_nvidiactl(dev_root)
    proc = subprocess.Popen(
        [SHELL, str(SCRIPT)],
        env={
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            **env_for(driver_root, dev_root, WAIT_INTERVAL_SECONDS="1"),
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()  # blocks until the script has checked once and reported
        assert "NVIDIA driver not ready" in first
        assert proc.poll() is None, "must keep waiting while the driver is missing"
        install_library(driver_root)
        assert proc.wait(timeout=15) == 0
        assert "NVIDIA driver ready" in proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_gives_up_after_the_timeout(roots: tuple[Path, Path]) -> None:
    driver_root, dev_root = roots
    proc = run(env_for(driver_root, dev_root, WAIT_INTERVAL_SECONDS="1", WAIT_TIMEOUT_SECONDS="1"))
    assert proc.returncode == 1
    assert "giving up after 1s (WAIT_TIMEOUT_SECONDS=1)" in proc.stdout
    assert proc.stdout.count("NVIDIA driver not ready") == 1, "hints are not repeated on every check"


@pytest.mark.parametrize("setting", ["WAIT_INTERVAL_SECONDS", "WAIT_TIMEOUT_SECONDS", "HINT_EVERY_SECONDS"])
def test_bad_setting_is_named(roots: tuple[Path, Path], setting: str) -> None:
    driver_root, dev_root = roots
    proc = run({**env_for(driver_root, dev_root), setting: "5s"})
    assert proc.returncode == 2
    assert f"{setting}=5s is not a whole number of seconds" in proc.stderr


def test_chart_ships_this_script_to_the_init_container(helm: Helm) -> None:
    objects = helm.render(["driverRoot=/run/nvidia/driver", "driverWait.intervalSeconds=7"])
    config_map = one(objects, "ConfigMap")
    assert config_map["data"]["wait-for-driver.sh"].strip() == SCRIPT.read_text().strip()
    pod = one(objects, "DaemonSet")["spec"]["template"]["spec"]
    [init] = pod["initContainers"]
    env = {e["name"]: e["value"] for e in init["env"]}
    mounts = {m["name"]: m["mountPath"] for m in init["volumeMounts"]}
    assert env == {
        "DRIVER_ROOT": mounts["driver-root"],
        "HOST_DRIVER_ROOT": "/run/nvidia/driver",
        "DEV_ROOT": mounts["dev"],
        "WAIT_INTERVAL_SECONDS": "7",
    }
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["driver-root"]["hostPath"]["path"] == "/run/nvidia/driver"
    assert volumes["dev"]["hostPath"]["path"] == "/dev"
    assert init["command"] == ["/bin/sh", f"{mounts['wait-for-driver']}/wait-for-driver.sh"]
    assert not by_driver_wait_disabled(helm)


def by_driver_wait_disabled(helm: Helm) -> list[object]:
    """What the driver wait leaves behind when switched off: init containers, its ConfigMap, its volume."""
    objects = helm.render(["driverWait.enabled=false"])
    pod = one(objects, "DaemonSet")["spec"]["template"]["spec"]
    volumes = [v for v in pod["volumes"] if v["name"] == "wait-for-driver"]
    return [*pod.get("initContainers", []), *[o for o in objects if o["kind"] == "ConfigMap"], *volumes]
