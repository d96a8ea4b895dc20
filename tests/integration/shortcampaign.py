"""What a short crash campaign of one part must show (tests/integration/test_*_crash_campaign.py)."""

from __future__ import annotations

from dra_sandbox.crashcampaign import NodeCampaign, ReportT


def run_short(campaign: NodeCampaign[ReportT], *, killed_at_own_points: bool = False) -> ReportT:
    """Run it: every trial ran and no invariant broke; with `killed_at_own_points`, the plugin was SIGKILLed at one of
    the part's own points at least once (else `unreached` says what the armed calls answered)."""
    report = campaign.run()
    assert report.violations == [], (report.summary(), report.violations)
    assert report.trials == campaign.trial_count, report.summary()
    if killed_at_own_points:
        assert report.kills_by_family()[campaign.family] > 0, (report.summary(), report.unreached)
    return report
