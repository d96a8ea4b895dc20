"""`--dist loadgroup` keeps an xdist_group on one worker (tests/xdistgroups.py): without it, under pytest 9.2 and
pytest-xdist 3.8.0, the groups were silently ignored and the upstream tests' real kubelets ran on both workers at
once (docs/device-plugin.md "Tests")."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Four tests of one group in two modules, two of another: plain `load` scheduling hands the first two tests to one
# worker and the next two to the other, so a group that is not honoured is split.
MODULE = """
import os
import pytest

pytestmark = pytest.mark.xdist_group("{group}")


@pytest.mark.parametrize("n", range({count}))
def test_where(n: int) -> None:
    with open(os.environ["WHERE_LOG"], "a") as log:
        log.write(f"{group} {{os.environ['PYTEST_XDIST_WORKER']}}\\n")
"""


def _groups_by_worker(tmp_path: Path, *plugin: str) -> dict[str, set[str]]:
    (tmp_path / "test_a.py").write_text(MODULE.format(group="one", count=2))
    (tmp_path / "test_b.py").write_text(MODULE.format(group="one", count=2))
    (tmp_path / "test_c.py").write_text(MODULE.format(group="two", count=2))
    log = tmp_path / "where.log"
    path = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "WHERE_LOG": str(log), "PYTHONPATH": path, "DRA_REQUEST_SHAPES": "off"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           *plugin, "-n", "2", "--dist", "loadgroup", str(tmp_path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    workers: dict[str, set[str]] = defaultdict(set)
    for line in log.read_text().splitlines():
        group, worker = line.split()
        workers[group].add(worker)
    return dict(workers)


def test_loadgroup_runs_each_group_on_one_worker(tmp_path: Path) -> None:
    workers = _groups_by_worker(tmp_path, "-p", "tests.xdistgroups")
    assert set(workers) == {"one", "two"}
    assert all(len(w) == 1 for w in workers.values()), workers


@pytest.mark.skipif(not hasattr(pytest.Item, "id"), reason="a pytest before structured node ids (9.2)")
def test_without_the_plugin_this_xdist_splits_a_group(tmp_path: Path) -> None:
    """The defect the plugin mends, shown (pytest-dev/pytest-xdist#1386); when an xdist release mends it itself this
    test fails: the plugin is then no longer needed and both can go."""
    workers = _groups_by_worker(tmp_path)
    assert len(workers["one"]) == 2, workers
