"""`dra-sandbox crash-campaign`'s trials per part (dra_sandbox/crashcampaigncommand.py): each part's share of --trials
by default, its own flag when given, 0 leaving the part out."""

from __future__ import annotations

from dra_driver.commands.flags import FlagParser
from dra_sandbox.crashcampaigncommand import PART_TRIALS, add_arguments, part_trials


def _shares(*argv: str) -> dict[str, int]:
    parser = FlagParser(prog="crash-campaign")
    add_arguments(parser)
    return part_trials(parser.parse_args(list(argv)))


def test_each_part_takes_its_share_of_the_trials_by_default() -> None:
    assert [flag for flag, *_ in PART_TRIALS] == ["--cd-trials", "--vgpu-trials", "--fm-trials", "--dp-trials"]
    assert _shares("--trials", "1000") == {"--cd-trials": 250, "--vgpu-trials": 333, "--fm-trials": 166,
                                           "--dp-trials": 166}  # fmt: skip
    # A short run still gives every part its least (the vGPU part one trial on each of its two hosts).
    assert _shares("--trials", "3") == {"--cd-trials": 1, "--vgpu-trials": 2, "--fm-trials": 1, "--dp-trials": 1}


def test_a_parts_flag_wins_and_zero_leaves_it_out() -> None:
    shares = _shares("--trials", "60", "--fm-trials", "0", "--dp-trials", "25")
    assert shares == {"--cd-trials": 15, "--vgpu-trials": 20, "--fm-trials": 0, "--dp-trials": 25}
