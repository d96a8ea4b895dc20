"""Every figure README.md and docs/ state about what runs is checked here against the code that runs (issue 38):
the demo's scenarios and nodes, the version the sandbox reports, the default nodes of `dra-sandbox up`, and the
size of the test suite. A figure that no test can check (the demo's wall time) is written so it does not drift:
measured once, with the machine it was measured on."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from dra_driver.commands.flags import FlagParser
from dra_sandbox.cluster import DEFAULT_KUBE_VERSION, ClusterConfig
from dra_sandbox.demo import COMPUTE_DOMAIN_SCENARIO, DEMO_SCENARIOS
from dra_sandbox.e2e.sandbox import E2E_KUBE_VERSION, E2E_NODES
from dra_sandbox.statedir import StateDir
from dra_sandbox.up import _cluster_config, add_arguments
from tests.conftest import WHOLE_SUITE

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
SANDBOX_DOC = (ROOT / "docs" / "sandbox.md").read_text()
WORDS = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight", 9: "nine", 10: "ten"}


def _names(names: list[str]) -> str:
    """`a`, `b` and `c`, as the docs list names."""
    quoted = [f"`{n}`" for n in names]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " and " + quoted[-1]


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def _up_config(tmp_path: Path, *argv: str) -> ClusterConfig:
    parser = FlagParser(prog="dra-sandbox up")
    add_arguments(parser)
    return _cluster_config(parser.parse_args(list(argv)), StateDir(tmp_path))


def test_the_demo_scenarios_are_the_ones_the_docs_name() -> None:
    every = [*DEMO_SCENARIOS, COMPUTE_DOMAIN_SCENARIO]
    sentence = f"the e2e scenarios {_names(list(DEMO_SCENARIOS))}, then `{COMPUTE_DOMAIN_SCENARIO}`"
    assert sentence in " ".join(README.split()), "README 'What `make demo` shows' names other scenarios"
    assert f"{WORDS[len(every)]} scenarios" in " ".join(README.split())
    assert f"on {WORDS[len(every)]} scenarios" in " ".join(SANDBOX_DOC.split())


def test_the_demo_and_up_nodes_are_the_ones_the_docs_name(tmp_path: Path) -> None:
    config = _up_config(tmp_path)
    up_nodes = [n.name for n in config.nodes]
    assert up_nodes == [name for name, _ in E2E_NODES.values()]  # the demo's and the e2e runner's nodes
    flat = " ".join(README.split())
    assert f"no --nodes: the demo's {WORDS[len(up_nodes)]} nodes" in flat
    assert f"{WORDS[len(up_nodes)].capitalize()} fake nodes (" in flat
    bullet = " ".join(SANDBOX_DOC.split()).split("Without `--nodes`:", 1)[1].split("labelled", 1)[0]
    assert re.findall(r"`(node-[a-z0-9-]+)`", bullet) == up_nodes


def test_the_reported_version_is_the_one_the_docs_name(tmp_path: Path) -> None:
    assert _up_config(tmp_path).kube_version == DEFAULT_KUBE_VERSION
    assert _up_config(tmp_path, "--nodes", "n=l4x2").kube_version == DEFAULT_KUBE_VERSION
    assert f"the sandbox reports {_minor(DEFAULT_KUBE_VERSION)} by default" in " ".join(README.split())
    compatibility = " ".join((ROOT / "docs" / "compatibility.md").read_text().split())
    assert f"The sandbox reports **{DEFAULT_KUBE_VERSION}** by default" in compatibility
    assert f"The e2e sandbox reports {_minor(E2E_KUBE_VERSION)}, the kind recipe's default release" in " ".join(
        SANDBOX_DOC.split())


def _stated_test_count() -> int:
    match = re.search(r"pytest \(over ([0-9,]+) tests", README)
    assert match, "README: `make test` ... pytest (over N tests, ...)"
    return int(match.group(1).replace(",", ""))


def _collected(request: pytest.FixtureRequest) -> int:
    """The suite's size: this session's collection when it is the whole suite (`make test`), else pytest's own
    `--collect-only` in a subprocess."""
    whole = request.config.stash.get(WHOLE_SUITE, None)
    if whole is not None:
        return whole
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    match = re.search(r"^([0-9]+) tests? collected", done.stdout, re.MULTILINE)
    assert match, done.stdout[-2000:] + done.stderr[-2000:]
    return int(match.group(1))


def test_the_test_count_in_the_readme_is_rounded_down_and_recent(request: pytest.FixtureRequest) -> None:
    """The rule: 'over N' with N a whole hundred at most the collected count and within 15 % of it (the suite
    grows; the figure is raised once it is more than 15 % behind)."""
    stated, collected = _stated_test_count(), _collected(request)
    assert stated % 100 == 0
    assert stated <= collected < stated * 1.15, f"README says over {stated:,} tests; pytest collects {collected:,}"
