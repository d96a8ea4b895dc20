"""The kubelet plugin's `--fabric-manager-*` flags (dra_driver/commands/fabricmanager_flags.py): from the command line
or `DRA_DRIVER_<FLAG>` to where the real client asks Fabric Manager; asked only with `--fabric-partitions on`; a bad
value stops the plugin at start naming the flag."""

from __future__ import annotations

import pytest

from dra_driver.commands import kubelet_plugin
from dra_driver.commands.fabricmanager_flags import fabric_manager_from_args
from dra_driver.commands.flags import FlagParser, apply_env_defaults
from dra_driver.nvml.fabricmanager import FabricManagerAddress


def _parser(environ: dict[str, str]) -> FlagParser:
    parser = FlagParser(prog="kubelet-plugin")
    kubelet_plugin.add_arguments(parser)
    apply_env_defaults(parser, environ)
    return parser


def test_defaults_are_fms_recommended_socket_and_the_driver_roots_library() -> None:
    args = _parser({}).parse_args(["--node-name", "n1", "--fabric-partitions", "on"])
    assert fabric_manager_from_args(args) == FabricManagerAddress(
        library="", unix_socket="/run/nvidia-fabricmanager/socket", tcp=""
    )


def test_from_the_environment_as_the_chart_sets_it() -> None:
    environ = {
        "DRA_DRIVER_FABRIC_PARTITIONS": "on",
        "DRA_DRIVER_FABRIC_MANAGER_LIBRARY": "/driver-root/usr/lib/x86_64-linux-gnu/libnvfm.so.1",
        "DRA_DRIVER_FABRIC_MANAGER_SOCKET": "/driver-root/run/nvidia-fabricmanager/socket",
        "DRA_DRIVER_FABRIC_MANAGER_ADDRESS": "10.0.0.7:6666",
    }
    address = fabric_manager_from_args(_parser(environ).parse_args(["--node-name", "n1"]))
    assert address is not None
    assert address.library == "/driver-root/usr/lib/x86_64-linux-gnu/libnvfm.so.1"
    assert address.describe() == "TCP 10.0.0.7:6666"  # the address wins over the socket


def test_not_asked_with_fabric_partitions_off() -> None:
    args = _parser({}).parse_args(["--node-name", "n1", "--fabric-manager-address", "nonsense"])
    assert fabric_manager_from_args(args) is None


def test_a_bad_value_is_refused_naming_the_flag() -> None:
    """kubelet_plugin.run prints it and returns 2 before anything starts, as for every flag parsed there (not run
    here: run() configures logging for the process)."""
    args = _parser({}).parse_args(
        ["--node-name", "n1", "--fabric-partitions", "on", "--fabric-manager-address", "fm:1"]
    )
    with pytest.raises(ValueError) as refused:
        fabric_manager_from_args(args)
    assert str(refused.value).startswith("--fabric-manager-address 'fm:1': give FM's command address as <ipv4>")
