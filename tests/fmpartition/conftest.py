"""The Fabric Manager rig, fresh for each test (tests/fmpartition/fmrig.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fmpartition.fmrig import FmRig


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[FmRig]:
    r = FmRig(tmp_path)
    yield r
    r.engine.close()
