"""bench/explain_bench.py and bench/decode_bench.py run and report figures (never timed pass/fail)."""

from __future__ import annotations

import pytest

from bench import decode_bench, explain_bench


def test_the_explain_client_pass_finds_the_last_node_and_prunes_the_rest() -> None:
    out = explain_bench.offline(4)
    assert out["slices"] > 4 and out["mb"] > 0
    assert out["last"]["fits"] == 1 and out["nowhere"]["fits"] == 0
    assert out["last"]["pruned_slices"] > 0 and out["nowhere"]["kept_slices"] == 0
    assert out["last_all_devices"]["fits"] == 1 and out["last_all_devices"]["pruned_slices"] == 0


def test_the_decoder_bench_reports_every_installed_decoder(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_NODES", "2")
    monkeypatch.setattr(decode_bench, "RUNS", 1)
    out = decode_bench.run()
    assert out["slices"] > 2 and out["product (decode_json)"]["pages_s"] > 0 and out["stdlib json"]["events_s"] > 0
