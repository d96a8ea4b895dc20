"""dra_sandbox.paths.Below: a directory layout's path attributes."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from dra_sandbox.paths import Below


@dataclass(frozen=True)
class Layout:
    root: Path
    logs: Path = field(default=Path("/var/log/x"))

    config = Below("config.toml")
    nested = Below("a", "b.json")
    log = Below("x.log", base="logs")


class Mutable:
    def __init__(self, root: object) -> None:
        self.root = root

    data = Below("data")


def test_paths_follow_their_base() -> None:
    layout = Layout(Path("/srv/node"))
    assert layout.config == Path("/srv/node/config.toml")
    assert layout.nested == Path("/srv/node/a/b.json")
    assert layout.log == Path("/var/log/x/x.log")
    assert Layout(Path("/other")).config == Path("/other/config.toml")


def test_a_path_is_not_a_field() -> None:
    assert [f for f in Layout.__dataclass_fields__] == ["root", "logs"]
    assert Layout(Path("/a")) == Layout(Path("/a"))


def test_a_path_cannot_be_set_on_its_own() -> None:
    node = Mutable(Path("/n"))
    with pytest.raises(AttributeError, match=r"Mutable\.data is derived from root; set that instead"):
        node.data = Path("/elsewhere")
    node.root = Path("/m")
    assert node.data == Path("/m/data")


def test_a_base_that_is_no_path_is_refused() -> None:
    with pytest.raises(TypeError, match=r"Mutable\.root is str, not a Path"):
        _ = Mutable("/n").data


def test_no_parts_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one path part"):
        Below()
