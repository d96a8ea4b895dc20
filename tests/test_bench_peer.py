"""`bench.peer_bench`'s pure parts (no Go, no processes): /proc parsing, API request counts, the side-by-side table,
the goals; and that a machine without Go gets a skip, not a failure. `make bench-peer` runs the bench itself."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.common import (
    DEV_ONLY_IMPORTS,
    IMAGE_ENV,
    cpu_seconds_from_stat,
    filesystem_of,
    image_like_pythonpath,
    rss_mib_from_status,
    runtime_dir,
    system_seconds_from_stat,
    work_dir,
)
from bench.peer_bench import (
    Figures,
    format_table,
    goal_lines,
    markdown_table,
    requests_per_claim,
    table_rows,
)

ROOT = Path(__file__).resolve().parents[1]


def test_cpu_seconds_come_from_utime_and_stime_even_when_the_command_name_has_spaces_and_parens() -> None:
    # pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime cutime cstime ...
    stat = "4242 (dra (example) plugin) S 1 4242 4242 0 -1 4194560 900 0 3 0 250 150 70 30 20 0 9 0 1000 0 0"
    assert cpu_seconds_from_stat(stat, 100) == pytest.approx(4.0)  # (250 + 150) / 100; children's 70 + 30 excluded


def test_the_benchs_plugin_gets_the_images_environment() -> None:
    dockerfile = (Path(__file__).resolve().parents[1] / "Dockerfile").read_text().replace("\\\n", " ")
    final_stage = dockerfile.rsplit("\nFROM ", 1)[1]
    env_words = [w for line in final_stage.splitlines() if line.startswith("ENV ") for w in line.split()[1:]]
    assert all(f"{key}={value}" in env_words for key, value in IMAGE_ENV.items())


def test_system_seconds_are_stime_alone() -> None:
    stat = "42 (python (x) y) S 1 2 3 4 5 6 7 8 9 10 250 125 0 0 20 0 1 0"
    assert system_seconds_from_stat(stat, 100) == 1.25


def test_rss_is_read_in_mib_and_is_nan_for_a_process_without_one() -> None:
    assert rss_mib_from_status("Name:\tx\nVmHWM:\t 90000 kB\nVmRSS:\t   61440 kB\nThreads:\t9\n") == 60.0
    assert math.isnan(rss_mib_from_status("Name:\tzombie\nState:\tZ (zombie)\n"))


MOUNTS = """/dev/vda / ext4 rw,relatime 0 0
tmpfs /dev/shm tmpfs rw,relatime 0 0
tmpfs /run tmpfs rw,nosuid 0 0
/dev/vdb /var/lib/kubelet xfs rw 0 0
"""


def test_a_path_lies_on_the_filesystem_of_the_longest_mount_point_above_it() -> None:
    assert filesystem_of(Path("/dev/shm/drapeer-x/cdi"), MOUNTS) == "tmpfs"
    assert filesystem_of(Path("/dev/shm"), MOUNTS) == "tmpfs"
    assert filesystem_of(Path("/dev/shmem/x"), MOUNTS) == "ext4"  # a sibling whose name starts alike is not inside
    assert filesystem_of(Path("/var/lib/kubelet/plugins/x"), MOUNTS) == "xfs"
    assert filesystem_of(Path("/tmp/drab-1/plugin"), MOUNTS) == "ext4"
    assert filesystem_of(Path("/x"), "garbage\n") == "?"


def test_the_runtime_dir_is_fresh_and_removed_after() -> None:
    with runtime_dir("drabtest-") as path:
        assert path.is_dir() and not any(path.iterdir())
        (path / "spec.json").write_text("{}")
    assert not path.exists()


def test_the_work_dir_lies_under_bench_work_dir_and_a_missing_one_is_refused_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BENCH_WORK_DIR", str(tmp_path))
    made = work_dir("drabtest-")
    assert made.parent == tmp_path and made.name.startswith("drabtest-") and made.is_dir()
    monkeypatch.setenv("BENCH_WORK_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(SystemExit, match=r"BENCH_WORK_DIR=.*nowhere.* is not a directory"):
        work_dir("drabtest-")


def test_the_plugin_runs_without_the_dev_only_packages_but_keeps_the_tree_under_test(tmp_path: Path) -> None:
    path = image_like_pythonpath(tmp_path, f"/some/checkout{os.pathsep}/some/checkout/sandbox")
    assert path.split(os.pathsep)[1:] == ["/some/checkout", "/some/checkout/sandbox"]
    probe = "import importlib, json\n"
    probe += "def ok(name):\n    try:\n        importlib.import_module(name)\n    except ImportError:\n        return False\n"
    probe += "    return True\n"
    probe += f"print(json.dumps([ok(n) for n in {list(DEV_ONLY_IMPORTS)!r}] + [ok('structlog')]))"
    out = subprocess.run([sys.executable, "-c", probe], env={**os.environ, "PYTHONPATH": path}, check=True,
                         capture_output=True, text=True).stdout  # fmt: skip
    assert json.loads(out) == [False] * len(DEV_ONLY_IMPORTS) + [True]


def test_requests_per_claim_is_the_difference_of_two_tallies_summed_over_codes() -> None:
    before = [{"verb": "get", "resource": "resourceclaims", "code": 200, "count": 10},
              {"verb": "list", "resource": "resourceslices", "code": 200, "count": 3}]
    after = [{"verb": "get", "resource": "resourceclaims", "code": 200, "count": 30},
             {"verb": "get", "resource": "resourceclaims", "code": 404, "count": 2},
             {"verb": "update", "resource": "resourceclaims/status", "code": 200, "count": 20},
             {"verb": "list", "resource": "resourceslices", "code": 200, "count": 3}]
    assert requests_per_claim(before, after, 20) == {"get resourceclaims": 1.1, "update resourceclaims/status": 1.0}


def _figures(scale: float) -> Figures:
    return Figures(
        prepare_s=tuple(0.001 * scale * i for i in range(1, 101)),  # 1..100 ms scaled: p50 50.5, p99 99.01
        unprepare_s=(0.002 * scale,) * 10,
        rates={"prepare 1": (100 / scale, 120 / scale, 110 / scale), "prepare 64": (400 / scale,)},
        cpu_ms_per_claim={"1": (4.0 * scale, 6.0 * scale), "64": (3.0 * scale,)},
        server_cpu_ms_per_claim=(1.0,),
        api_requests_per_claim={"get resourceclaims": 1.0, "create events": 0.5 * scale},
        registered_s=(0.5 * scale, 0.7 * scale, 0.6 * scale),
        rss_at_rest_mib=(60.0 * scale,),
        rss_before_cycles_mib=60.0,
        rss_after_cycles_mib=61.5,
        cycles=10_048,
    )


def test_the_table_puts_medians_side_by_side_with_the_ratio_and_marks_what_was_not_measured() -> None:
    rows = {r.figure: r for r in table_rows(_figures(2.0), _figures(1.0))}
    p50 = rows["prepare p50, 1 at a time"]
    assert (p50.ours, p50.example, p50.unit) == (101.0, 50.5, "ms") and p50.ratio == pytest.approx(2.0)
    assert not p50.ours_better_or_equal
    rate = rows["prepare claims/s, 1 concurrent"]
    assert (rate.ours, rate.example) == (55.0, 110.0) and not rate.ours_better_or_equal  # medians of the rounds
    assert rows["plugin CPU per claim, 1 concurrent"].ours == 10.0  # median of (8, 12)
    assert rows["API requests per claim"].ours == 2.0 and rows["API requests per claim"].example == 1.5
    assert rows["start -> registered (GetInfo answers)"].ours == 1.2
    missing = rows["prepare claims/s, 8 concurrent"]  # no such figure in either: NaN, shown as "-"
    assert math.isnan(missing.ours) and math.isnan(missing.ratio)
    text = format_table(list(rows.values()))
    assert "prepare p50, 1 at a time" in text and "    2.00  ms" in text
    md = markdown_table(list(rows.values()), "example driver v0.4.0").splitlines()
    assert md[0] == "| figure | ours | example driver v0.4.0 | ours / example |"
    assert "| prepare p50, 1 at a time (ms) | 101 | 50.5 | 2.00 |" in md
    assert "| prepare claims/s, 8 concurrent (claims/s) | - | - | - |" in md


def test_goal_lines_say_met_where_ours_is_at_least_as_good_and_give_cpu_as_a_ratio() -> None:
    lines = goal_lines(table_rows(_figures(0.5), _figures(1.0)))
    assert "prepare p50, 1 at a time: ours 25.2 vs 50.5 ms: met" in lines
    assert "prepare claims/s, 64 concurrent: ours 800 vs 400 claims/s: met" in lines
    assert "plugin CPU per claim, 1 concurrent: ours / example = 0.50" in lines
    assert not any(line.startswith("prepare claims/s, 8 concurrent") for line in lines)  # not measured: no verdict
    worse = goal_lines(table_rows(_figures(3.0), _figures(1.0)))
    assert "unprepare p50, 1 at a time: ours 6.0 vs 2.0 ms: NOT met" in worse


def test_without_go_the_bench_skips_with_the_reason_and_exits_0(tmp_path: Path) -> None:
    """PATH without `go`: the build step says why and nothing is measured (no API server, no plugin)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").symlink_to(sys.executable)
    out = subprocess.run([sys.executable, "-m", "bench.peer_bench", "--rounds", "1"], cwd=ROOT,
                         env={"PATH": str(bin_dir), "HOME": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "cache")},
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "bench-peer: SKIPPED: the example driver cannot be built on this machine: no Go toolchain" in out.stdout
    assert "== ours beside" not in out.stdout and not (tmp_path / "cache").exists()


def test_bad_counts_are_refused_naming_the_option() -> None:
    out = subprocess.run([sys.executable, "-m", "bench.peer_bench", "--cycles", "0"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, check=False)
    assert out.returncode == 2 and "--cycles must be at least 1" in out.stderr
