"""The probe's output format, parsed without running anything."""

from __future__ import annotations

from dra_sandbox.runtime.probe import parse_probe_output
from dra_sandbox.runtime.types import ObservedDevice, ObservedMount


def test_parse_full_output() -> None:
    text = "\n".join(
        [
            "ENV PATH=/bin",
            "ENV MSG=two\\x20words\\x0aand\\\\slash",
            "MNT /dev/vda\\x20/mnt/my\\134dir\\x20ext4\\x20ro,relatime\\x200\\x200",
            "MNT tmpfs\\x20/dev\\x20tmpfs\\x20rw\\x200\\x200",
            "DEV /dev/null c 1 3",
            "DEV /dev/sp\\x20ace b 8 1",
            "GID 0",
            "GID 44",
            "FILE /mnt/a/marker hello\\x20world",
            "NOFILE /missing 2",
            "END",
        ]
    )
    report = parse_probe_output(text)
    assert report.complete
    assert report.env == {"PATH": "/bin", "MSG": "two words\nand\\slash"}
    assert report.mounts == (
        ObservedMount("/mnt/my\\dir", "/dev/vda", "ext4", ("ro", "relatime")),
        ObservedMount("/dev", "tmpfs", "tmpfs", ("rw",)),
    )
    assert report.devices == (ObservedDevice("/dev/null", "c", 1, 3), ObservedDevice("/dev/sp ace", "b", 8, 1))
    assert report.gids == (0, 44)
    assert report.files == {"/mnt/a/marker": "hello world", "/missing": None}


def test_missing_end_marker_means_incomplete() -> None:
    assert parse_probe_output("ENV A=1\n").complete is False
