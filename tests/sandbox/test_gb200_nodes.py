"""`dra-sandbox up --nodes a=gb200-nvl72,b=gb200-nvl72,...` builds GB200 NVL72 trays of one multi-node NVLink fabric:
one cluster UUID, a clique per rack of 18 nodes; `dra-driver inventory` against a node shows its clique."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from dra_sandbox.up import NODES_PER_CLIQUE, parse_nodes

REPO = Path(__file__).resolve().parents[2]
ENV = {k: v for k, v in os.environ.items() if not k.startswith("DRA_DRIVER_")}
CLUSTER = "5c3e7a1f-2b4d-4e8a-9f61-0d2c8b7a4e13"


def test_rack_nodes_fill_cliques_of_eighteen_in_the_order_given() -> None:
    names = [f"t{i}" for i in range(NODES_PER_CLIQUE + 2)]
    text = ",".join([f"{n}=gb200-nvl72" for n in names[:10]] + ["h=dgx-h100"] + [f"{n}=gb200-nvl72" for n in names[10:]])
    specs = dict(parse_nodes(text))
    assert specs["h"] == "fake:dgx-h100"  # other presets are not counted and get no clique
    assert [specs[n] for n in names] == (
        ["fake:gb200-nvl72,clique=0"] * NODES_PER_CLIQUE + ["fake:gb200-nvl72,clique=1"] * 2
    )


def _run(*argv: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *argv], cwd=REPO, env=ENV, capture_output=True, text=True,
                          timeout=timeout, check=False)


@pytest.mark.slow
def test_up_builds_one_clique_and_inventory_shows_it() -> None:
    state = Path(tempfile.mkdtemp(dir="/tmp", prefix="dra-gb2-"))
    up = _run("dra_sandbox", "up", "--detach", "--state-dir", str(state), "--nodes", "a=gb200-nvl72,b=gb200-nvl72",
              "--runtime", "cdi-check", "--no-controller", timeout=180)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        cliques = {}
        uuids = {}
        for node in ("a", "b"):
            spec = (state / node / "nvml" / "spec").read_text().strip()
            assert spec.startswith("fake:gb200-nvl72,clique=0,state=")
            out = _run("dra_driver.cli", "inventory", "--nvml", spec, "-o", "json", timeout=60)
            assert out.returncode == 0, out.stderr
            doc = json.loads(out.stdout)
            cliques[node] = doc["clique"]
            uuids[node] = {g["info"]["uuid"] for g in doc["gpus"]}
            assert [g["info"]["name"] for g in doc["gpus"]] == ["NVIDIA GB200"] * 4
        assert cliques == {"a": {"id": f"{CLUSTER}.0", "problem": None}, "b": {"id": f"{CLUSTER}.0", "problem": None}}
        assert uuids["a"].isdisjoint(uuids["b"])  # two trays, not one node twice
    finally:
        _run("dra_sandbox", "down", "--state-dir", str(state), timeout=120)
        shutil.rmtree(state, ignore_errors=True)
