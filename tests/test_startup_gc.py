"""The start-up GC pause (commands/dispatch.pause_gc): the cyclic collector is off while a subcommand's modules load
(the kubelet plugin's: until its NVML backend is open) and back on before the command's own work starts."""

from __future__ import annotations

import argparse
import gc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver.commands.dispatch import Command, Subcommand, main_for, pause_gc
from dra_driver.commands.flags import FlagParser


@pytest.fixture(autouse=True)
def collector_restored() -> Iterator[None]:
    enabled = gc.isenabled()
    yield
    (gc.enable if enabled else gc.disable)()


def test_a_pause_puts_the_collector_back_as_it_was() -> None:
    gc.enable()
    resume = pause_gc()
    assert not gc.isenabled()
    resume()
    resume()  # idempotent: the plugin may call it more than once
    assert gc.isenabled()

    gc.disable()
    resume = pause_gc()
    resume()
    assert not gc.isenabled()  # off before the pause (a caller's choice): stays off


class _Recorder:
    """A subcommand that notes whether the collector ran while it was loaded and while it ran."""

    def __init__(self) -> None:
        self.seen: dict[str, bool] = {}

    def load(self) -> Command:
        self.seen["load"] = gc.isenabled()
        return self

    def add_arguments(self, parser: FlagParser) -> None:
        self.seen["arguments"] = gc.isenabled()

    def run(self, args: argparse.Namespace) -> int:
        self.seen["run"] = gc.isenabled()
        return 7


def test_the_subcommand_loads_without_the_collector_and_runs_with_it() -> None:
    gc.enable()
    recorder = _Recorder()
    assert main_for("prog", "", "0", [Subcommand("go", "", recorder.load)], ["go"]) == 7
    assert recorder.seen == {"load": False, "arguments": False, "run": True}
    assert gc.isenabled()


class _PluginDouble:
    """Stands in for `KubeletPlugin`: notes whether the collector runs when the plugin is built."""

    built_with_gc: list[bool] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.built_with_gc.append(gc.isenabled())

    def run_until_signal(self) -> int:
        return 0


def test_the_kubelet_plugin_loads_without_the_collector_and_builds_the_plugin_with_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from dra_driver.commands import kubelet_plugin, nvml_flags
    from dra_driver.k8s import client
    from dra_driver.plugin import app

    opened_with_gc: list[bool] = []
    real_open = nvml_flags.nvml_from_args

    def open_nvml(*args: Any, **kwargs: Any) -> Any:
        opened_with_gc.append(gc.isenabled())
        return real_open(*args, **kwargs)

    monkeypatch.setattr(nvml_flags, "nvml_from_args", open_nvml)
    monkeypatch.setattr(app, "KubeletPlugin", _PluginDouble)
    monkeypatch.setattr(client, "connect", lambda *args, **kwargs: None)
    parser = FlagParser(prog="test")
    kubelet_plugin.add_arguments(parser)
    args = parser.parse_args(["--node-name", "n1", "--nvml", "fake:dgx-h100", "--plugin-dir", str(tmp_path)])
    gc.enable()
    _PluginDouble.built_with_gc.clear()
    assert kubelet_plugin.run(args) == 0
    assert opened_with_gc == [False]  # the backend's modules load with the collector paused
    assert _PluginDouble.built_with_gc == [True]
    assert gc.isenabled()
