"""bench/fleet_upstream_bench.py's pure parts: the fleet it writes and grows, what the policy must count, the
launcher's report, and the goals table (the bench itself runs only by `make bench-fleet-upstream`)."""

from __future__ import annotations

from bench.fleet_upstream_bench import ab_table, claim, fleet, goal_rows, h100_counts, launched, table


def test_a_fleet_grows_by_keeping_its_nodes_and_its_one_h200_node_last() -> None:
    small, large = fleet(5), fleet(9)
    assert [n.name for n in small] == ["fleet-0000", "fleet-0001", "fleet-0002", "fleet-0003", "fleet-last"]
    assert [n.preset for n in small] == ["dgx-h100", "dgx-a100", "a30x4", "l4x2", "hgx-h200"]
    assert set(small) <= set(large) and sorted(n.name for n in large)[-1] == "fleet-last"
    assert len({n.salt for n in large}) == len(large)  # every node's GPU UUIDs its own
    assert h100_counts(large, 8) == (16, 2)  # fleet-0000 and fleet-0004
    assert claim("nine")["spec"]["devices"]["requests"][0]["exactly"]["count"] == 9


def test_the_goals_table_puts_both_servers_side_by_side_and_marks_what_missed() -> None:
    assert launched("1.5 204800 2 0.75\n") == {"s": 1.5, "cpu_s": 0.75, "rss_mib": 200.0, "rc": 2}
    run = {"s": 0.8, "cpu_s": 0.5, "server_cpu_s": 0.3, "rss_mib": 70.0, "rc": 2}
    results = {
        "sandbox": {"300": {"explain": {"nine": run}, "status": {**run, "s": 2.5},
                            "controller": {"start_to_counts_s": 4.0, "cpu_to_counts_s": 2.0, "rss_mib": 190.0}}},
        "upstream": {"300": {"explain": {"nine": {**run, "s": 1.2}}}},
        "other": {"skipped": "not built"},
    }
    rows = goal_rows(results)
    assert [(r["server"], r["figure"], r["met"]) for r in rows] == [
        ("sandbox", "explain nine", True), ("sandbox", "status", False),
        ("sandbox", "controller start -> counts", True), ("upstream", "explain nine", False)]
    assert rows[0]["goal_s"] == 1.0  # 300 nodes: explain within 1 s
    lines = table(rows).splitlines()
    assert lines[0] == ("| nodes | figure | goal | sandbox: wall s / CPU s / server CPU s / RSS MiB | "
                        "upstream: wall s / CPU s / server CPU s / RSS MiB |")
    assert lines[2] == "| 300 | explain nine | ≤ 1 s | 0.80 / 0.5 / 0.3 / 70.0 | 1.20 ✗ / 0.5 / 0.3 / 70.0 |"
    assert lines[3] == "| 300 | status | ≤ 2 s | 2.50 ✗ / 0.5 / 0.3 / 70.0 | - |"
    assert lines[4] == "| 300 | controller start -> counts | ≤ 10 s | 4.00 / 2.0 / - / 190.0 | - |"


def test_the_ab_table_gives_each_trees_range_per_figure() -> None:
    runs = {"A": [{"s": 2.5, "cpu_s": 1.5, "server_cpu_s": 1.2, "rss_mib": 200.0},
                  {"s": 2.1, "cpu_s": 1.4, "server_cpu_s": 1.3, "rss_mib": 201.0}],
            "B": [{"s": 1.9, "cpu_s": 1.2, "server_cpu_s": None, "rss_mib": 190.0}]}
    text = ab_table({"load_at_start": "1 1 1", "upstream": {"1000": {"ab": {"explain nowhere": runs}}},
                     "sandbox": {"skipped": "no"}})
    lines = text.splitlines()
    assert lines[2] == "| upstream | 1000 | explain nowhere | A | 2.10-2.50 | 1.40-1.50 | 1.20-1.30 | 200.00-201.00 |"
    assert lines[3] == "| upstream | 1000 | explain nowhere | B | 1.90 | 1.20 | - | 190.00 |"
    assert len(lines) == 4
