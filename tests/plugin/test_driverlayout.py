"""The driver layout check (plugin/driverlayout.py): each supported layout passes, each wrong one names the value."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from dra_driver.nvidiadriver.wait import DriverPaths
from dra_driver.plugin.driverlayout import (
    OPERATOR_DRIVER_ROOT,
    CdiHookBinary,
    CdiHooks,
    LayoutSettings,
    Severity,
    inspect_driver_layout,
    kernel_module_version,
    probe_layout,
    refusal,
    resolve_cdi_hook,
    wait_reason,
)

VERSION = "570.133.20"
KERNEL_LINE = (
    f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {VERSION}  Release Build  (dvs-builder@U16-I3-B03-4-3)"
    "  Tue Mar 18 10:21:40 UTC 2025\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n"
)


def install_driver(root: Path, version: str = VERSION, smi: bool = True) -> None:
    """The files of a driver install the check looks at: the versioned NVML library, its soname link, nvidia-smi."""
    lib = root / "usr/lib/x86_64-linux-gnu"
    lib.mkdir(parents=True, exist_ok=True)
    (lib / f"libnvidia-ml.so.{version}").write_bytes(b"\x7fELF")
    (lib / "libnvidia-ml.so.1").symlink_to(f"libnvidia-ml.so.{version}")
    if smi:
        (root / "usr/bin").mkdir(parents=True, exist_ok=True)
        (root / "usr/bin/nvidia-smi").write_bytes(b"\x7fELF")


class Node:
    """A node's filesystem as the plugin's container sees it: the driver root mount, /proc, /dev, the toolkit dir."""

    def __init__(self, tmp: Path) -> None:
        self.root = tmp / "driver-root"
        self.root.mkdir()
        self.proc = tmp / "proc"
        self.dev = tmp / "dev"
        self.dev.mkdir()
        self.toolkit = tmp / "toolkit-root"

    def load_module(self, version: str = VERSION) -> None:
        (self.proc / "driver/nvidia").mkdir(parents=True, exist_ok=True)
        (self.proc / "driver/nvidia/version").write_text(KERNEL_LINE.replace(VERSION, version))
        (self.dev / "nvidiactl").symlink_to("/dev/null")  # any character device will do

    def install_hook(self, name: str = "nvidia-cdi-hook") -> None:
        self.toolkit.mkdir(exist_ok=True)
        hook = self.toolkit / name
        hook.write_text("#!/bin/sh\n")
        hook.chmod(0o755)

    def settings(
        self, host_driver_root: str, hooks: CdiHooks = CdiHooks.OFF, host_toolkit_dir: str = "/usr/bin"
    ) -> LayoutSettings:
        return LayoutSettings(
            paths=DriverPaths(
                driver_root=self.root, host_driver_root=Path(host_driver_root), dev_root=self.dev, proc_root=self.proc
            ),
            cdi_hooks=hooks,
            toolkit_dir=None if hooks is CdiHooks.OFF else self.toolkit,
            host_toolkit_dir=host_toolkit_dir,
        )


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


def test_kernel_module_version_reads_both_module_flavours() -> None:
    assert kernel_module_version(KERNEL_LINE) == VERSION
    proprietary = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.183.01  Sun May 12 19:39:15 UTC 2024\n"
    assert kernel_module_version(proprietary) == "535.183.01"
    assert kernel_module_version("garbage") is None


def test_host_installed_driver_with_driver_root_slash_passes(node: Node) -> None:
    install_driver(node.root)
    node.load_module()
    assert inspect_driver_layout(node.settings("/")) == []


def test_operator_driver_with_its_driver_root_passes(node: Node) -> None:
    # driverRoot=/run/nvidia/driver: the mount shows the driver container's root filesystem itself.
    install_driver(node.root)
    node.load_module()
    assert inspect_driver_layout(node.settings(OPERATOR_DRIVER_ROOT)) == []


def test_driver_root_slash_on_an_operator_node_is_refused_naming_the_value(node: Node) -> None:
    install_driver(node.root / OPERATOR_DRIVER_ROOT.lstrip("/"))
    node.load_module()
    problems = inspect_driver_layout(node.settings("/"))
    assert [p.severity for p in problems] == [Severity.ERROR]
    assert problems[0].message == (
        "driverRoot=/ but /run/nvidia/driver/usr/bin/nvidia-smi exists on the node: this node's driver comes from "
        "the GPU Operator's driver container; set driverRoot=/run/nvidia/driver"
    )
    assert refusal(problems) == problems[0].message


def test_operator_dir_still_empty_is_refused_too(node: Node) -> None:
    # The Operator made /run/nvidia/driver but its driver container has not mounted its root yet: the value is
    # wrong all the same, waiting would never help.
    (node.root / "run/nvidia/driver").mkdir(parents=True)
    problems = inspect_driver_layout(node.settings("/"))
    assert problems[0].severity is Severity.ERROR
    assert "set driverRoot=/run/nvidia/driver" in problems[0].message


def test_host_driver_matching_the_kernel_wins_over_a_stale_operator_root(node: Node) -> None:
    install_driver(node.root)
    install_driver(node.root / "run/nvidia/driver", version="565.57.01")
    node.load_module()
    problems = inspect_driver_layout(node.settings("/"))
    assert [p.severity for p in problems] == [Severity.WARNING]
    assert "set driverRoot=/run/nvidia/driver (and remove the host driver)" in problems[0].message


def test_operator_root_matching_the_kernel_wins_over_a_stale_host_library(node: Node) -> None:
    install_driver(node.root, version="565.57.01")
    install_driver(node.root / "run/nvidia/driver")
    node.load_module()
    problems = inspect_driver_layout(node.settings("/"))
    assert problems[0].severity is Severity.ERROR
    assert problems[0].message.endswith("set driverRoot=/run/nvidia/driver")


def test_operator_root_still_installing_is_a_wait_naming_both_ways_out(node: Node) -> None:
    node.load_module()
    problems = inspect_driver_layout(node.settings(OPERATOR_DRIVER_ROOT))
    assert [p.severity for p in problems] == [Severity.WAIT]
    reason = wait_reason(problems)
    assert reason is not None
    assert "no libnvidia-ml.so.1 under driverRoot=/run/nvidia/driver (the nvidia kernel module is loaded)" in reason
    assert "nvidia-driver-daemonset" in reason and "set driverRoot=/" in reason
    assert refusal(problems) is None


def test_nothing_installed_yet_waits_for_library_and_module(node: Node) -> None:
    problems = inspect_driver_layout(node.settings("/"))
    assert [p.severity for p in problems] == [Severity.WAIT, Severity.WAIT]
    assert "install the NVIDIA driver on the node" in problems[0].message
    assert "nvidiactl is missing: the nvidia kernel module is not loaded" in problems[1].message


def test_library_and_module_versions_must_match(node: Node) -> None:
    install_driver(node.root, version="565.57.01")
    node.load_module()
    problems = inspect_driver_layout(node.settings("/"))
    assert [p.severity for p in problems] == [Severity.WAIT]
    assert "the loaded nvidia kernel module is 570.133.20 but libnvidia-ml.so.1" in problems[0].message
    assert "is 565.57.01" in problems[0].message


def test_a_library_without_nvidia_smi_is_a_warning(node: Node) -> None:
    install_driver(node.root, smi=False)
    node.load_module()
    problems = inspect_driver_layout(node.settings("/"))
    assert [p.severity for p in problems] == [Severity.WARNING]
    assert "containers get no nvidia-smi" in problems[0].message


def test_relative_or_missing_driver_roots_are_refused(node: Node, tmp_path: Path) -> None:
    assert inspect_driver_layout(node.settings("run/nvidia/driver"))[0].severity is Severity.ERROR
    settings = LayoutSettings(paths=DriverPaths(driver_root=tmp_path / "absent", host_driver_root=Path("/")))
    problems = inspect_driver_layout(settings)
    assert problems[0].severity is Severity.ERROR
    assert "is not a directory in the plugin's container" in problems[0].message


def test_a_custom_driver_root_without_a_driver_names_both_presets(node: Node) -> None:
    node.load_module()
    problems = inspect_driver_layout(node.settings("/opt/nvidia"))
    assert "to / (host-installed driver) or /run/nvidia/driver (GPU Operator)" in problems[0].message


@pytest.mark.parametrize(
    ("binary", "prefix"), [("nvidia-cdi-hook", ("nvidia-cdi-hook",)), ("nvidia-ctk", ("nvidia-ctk", "hook"))]
)
def test_hook_found_is_named_by_its_host_path(node: Node, binary: str, prefix: tuple[str, ...]) -> None:
    install_driver(node.root)
    node.load_module()
    node.install_hook(binary)
    settings = node.settings(OPERATOR_DRIVER_ROOT, CdiHooks.AUTO, "/usr/local/nvidia/toolkit")
    facts = probe_layout(settings)
    assert resolve_cdi_hook(settings, facts) == CdiHookBinary(f"/usr/local/nvidia/toolkit/{binary}", prefix)
    assert inspect_driver_layout(settings) == []


def test_hooks_off_resolve_to_none_even_where_the_hook_exists(node: Node) -> None:
    node.install_hook()
    settings = node.settings("/")
    assert resolve_cdi_hook(settings, probe_layout(settings)) is None


def test_hooks_on_without_a_hook_refuse_naming_the_install_dir(node: Node) -> None:
    install_driver(node.root)
    node.load_module()
    node.toolkit.mkdir()
    problems = inspect_driver_layout(node.settings("/", CdiHooks.ON))
    assert [p.severity for p in problems] == [Severity.ERROR]
    assert problems[0].message.startswith(
        "containerToolkit.cdiHooks=on but containerToolkit.installDir=/usr/bin holds neither nvidia-cdi-hook nor "
        "nvidia-ctk"
    )


def test_hooks_auto_on_an_operator_node_suggests_the_operators_toolkit_dir(node: Node) -> None:
    install_driver(node.root)
    node.load_module()
    problems = inspect_driver_layout(node.settings(OPERATOR_DRIVER_ROOT, CdiHooks.AUTO, "/usr/bin"))
    assert [p.severity for p in problems] == [Severity.WARNING]
    assert "set containerToolkit.installDir=/usr/local/nvidia/toolkit" in problems[0].message


def test_hooks_auto_without_a_hook_on_a_host_node_is_quiet(node: Node) -> None:
    install_driver(node.root)
    node.load_module()
    node.toolkit.mkdir()
    settings = node.settings("/", CdiHooks.AUTO)
    assert inspect_driver_layout(settings) == []
    assert resolve_cdi_hook(settings, probe_layout(settings)) is None


def test_a_non_executable_hook_is_not_a_hook(node: Node) -> None:
    node.install_hook()
    (node.toolkit / "nvidia-cdi-hook").chmod(0o644)
    settings = node.settings("/", CdiHooks.AUTO)
    assert probe_layout(settings).hook is None


def test_the_hook_the_layout_check_found_reaches_the_cdi_specs(tmp_path: Path) -> None:
    """PluginSettings.cdi_hook (from --cdi-hooks) is what RealCdiEdits calls; without it, no hooks."""
    from dra_driver.inventory.catalog import MigOffering
    from dra_driver.plugin.app import PluginSettings, cdi_edits
    from dra_driver.plugin.cdi import FakeCdiEdits
    from dra_driver.plugin.cdidriverfiles import RealCdiEdits
    from dra_driver.plugin.driverlayout import CdiHookBinary

    base = PluginSettings(
        node_name="n", driver_name="gpu.dra.dev", plugin_dir=tmp_path / "p", registry_dir=tmp_path / "r",
        cdi_root=tmp_path / "cdi", driver_root=tmp_path, host_driver_root=Path("/run/nvidia/driver"),
        mig_offering=MigOffering.NONE, fake_cdi=False, healthz_port=None,
    )  # fmt: skip
    plain = cdi_edits(base)
    assert isinstance(plain, RealCdiEdits) and plain.hook_path is None
    hooked = cdi_edits(
        replace(base, cdi_hook=CdiHookBinary("/usr/local/nvidia/toolkit/nvidia-cdi-hook", ("nvidia-cdi-hook",)))
    )
    assert isinstance(hooked, RealCdiEdits) and hooked.hook_path == Path("/usr/local/nvidia/toolkit/nvidia-cdi-hook")
    assert isinstance(cdi_edits(replace(base, fake_cdi=True)), FakeCdiEdits)
    # --dev-root reaches the control-node check (it looked at this process's /dev whatever the flag said).
    moved = cdi_edits(replace(base, dev_root=tmp_path / "host-dev"))
    assert isinstance(moved, RealCdiEdits) and moved.dev_root == tmp_path / "host-dev"
