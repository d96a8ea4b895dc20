"""`dra-sandbox nvidia-driver unload|load|reload --node N` on a state dir's fake node, and `dra-sandbox up --driver`:
the driver file a plugin process reads changes (checked through a FakeNvml of its own, as the plugin's), bad input
is refused naming the flag."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dra_driver.nvml.factory import open_backend
from dra_driver.nvml.types import NvmlUnavailableError
from dra_sandbox.cli import main
from dra_sandbox.nvidiadriver import node_specs
from dra_sandbox.up import NodeSpecError, parse_driver


def _node(state: Path, name: str, *, absent: bool = False) -> str:
    """What the sandbox writes for a node when its plugin starts: <state>/<node>/nvml/spec."""
    (state / name / "nvml").mkdir(parents=True)
    spec = f"fake:l4x2,state={state / name / 'nvml' / 'nvml-state.json'},seed={name}" + (
        ",driver=absent" if absent else "")
    (state / name / "nvml" / "spec").write_text(spec + "\n")
    return spec


def test_unload_load_and_reload_change_the_driver_a_plugin_sees(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                                ) -> None:
    spec = _node(tmp_path, "node-a")
    _node(tmp_path, "node-b")
    plugin = open_backend(spec)
    plugin.init()
    assert plugin.system_info().driver_version == "580.105.08"
    state = ["--state-dir", str(tmp_path)]
    assert main(["nvidia-driver", "unload", "--node", "node-a", *state]) == 0
    out = capsys.readouterr().out
    assert "no `dra-sandbox up` runs in" in out
    assert "node-a: NVIDIA driver loaded (version 580.105.08, load #0) -> not loaded (version 580.105.08, load #0)" in out
    with pytest.raises(NvmlUnavailableError):
        open_backend(spec).init()
    assert main(["nvidia-driver", "load", "--node", "node-a", "--version", "580.126.09", *state]) == 0
    assert "-> loaded (version 580.126.09, load #1)" in capsys.readouterr().out
    plugin.shutdown()
    plugin.init()  # re-initialised, as the plugin does after a reload
    assert plugin.system_info().driver_version == "580.126.09"
    assert main(["nvidia-driver", "reload", "--node", "node-a", *state]) == 0
    assert "loaded (version 580.126.09, load #1) -> loaded (version 580.126.09, load #2)" in capsys.readouterr().out
    other = open_backend(f"fake:l4x2,state={tmp_path / 'node-b' / 'nvml' / 'nvml-state.json'}")
    other.init()
    assert other.system_info().driver_version == "580.105.08"  # only the node named changed


def test_a_node_started_without_a_driver_gets_one_on_load(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = _node(tmp_path, "node-a", absent=True)
    plugin = open_backend(spec)
    with pytest.raises(NvmlUnavailableError, match="DRIVER_NOT_LOADED"):
        plugin.init()
    assert main(["nvidia-driver", "load", "--node", "node-a", "--state-dir", str(tmp_path)]) == 0
    assert "not loaded (version 580.105.08, load #0) -> loaded (version 580.105.08, load #1)" in (
        capsys.readouterr().out)
    plugin.init()
    assert len(plugin.gpus()) == 2


def test_bad_input_names_the_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _node(tmp_path, "node-a")
    state = ["--state-dir", str(tmp_path)]
    assert main(["nvidia-driver", "load", "--node", "node-z", *state]) == 2
    assert f"--node node-z: no fake node of that name in {tmp_path}; nodes: node-a" in capsys.readouterr().err
    assert main(["nvidia-driver", "load", "--node", "node-a", "--state-dir", str(tmp_path / "none")]) == 2
    assert "nodes: none (is the sandbox up?" in capsys.readouterr().err
    assert main(["nvidia-driver", "unload", "--node", "node-a", "--version", "580.1.1", *state]) == 2
    assert "--version goes with load or reload" in capsys.readouterr().err
    assert main(["nvidia-driver", "load", "--node", "node-a", "--version", "new", *state]) == 2
    assert "--version 'new' is not a driver version; write e.g. 580.126.09" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["nvidia-driver", "rmmod", "--node", "node-a", *state])
    (tmp_path / "node-a" / "nvml" / "spec").write_text("fake:l4x2\n")  # no state file: nothing another process sees
    assert main(["nvidia-driver", "unload", "--node", "node-a", *state]) == 1
    assert "no fake NVML with a state file" in capsys.readouterr().err
    assert list(node_specs(tmp_path)) == ["node-a"]


def test_up_driver_names_the_nodes_that_start_without_one() -> None:
    nodes = ["node-h100", "node-a100"]
    assert parse_driver("loaded", nodes) == frozenset()
    assert parse_driver("absent", nodes) == frozenset(nodes)
    assert parse_driver("absent:node-a100", nodes) == frozenset({"node-a100"})
    with pytest.raises(NodeSpecError, match="unknown node node-x; the nodes are node-h100, node-a100"):
        parse_driver("absent:node-a100,node-x", nodes)
    with pytest.raises(NodeSpecError, match=re.escape("write loaded, absent (every node) or absent:NODE")):
        parse_driver("gone", nodes)
    with pytest.raises(NodeSpecError, match="no node named"):
        parse_driver("absent:", nodes)


def test_up_refuses_a_bad_driver_before_starting(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["up", "--state-dir", str(tmp_path), "--driver", "absent:node-x"]) == 2
    assert "--driver 'absent:node-x': unknown node node-x; the nodes are node-h100, node-a100, node-a100-whole" in (
        capsys.readouterr().err)
    assert not (tmp_path / "up.pid").exists()
