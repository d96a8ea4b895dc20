"""The hash-pinned dependency locks (requirements/*.lock) agree with pyproject.toml and with each other."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")
LOCK_HINT = "run `make locks` and commit requirements/"


def _lock(name: str) -> dict[str, tuple[Version, int]]:
    """package -> (pinned version, number of hashes) of one lock file."""
    pins: dict[str, tuple[Version, int]] = {}
    current: str | None = None
    for line in (REPO / "requirements" / name).read_text().splitlines():
        match = PIN.match(line)
        if match:
            current = canonicalize_name(match.group(1))
            assert current not in pins, f"{name}: {current} is pinned twice"
            pins[current] = (Version(match.group(2)), 0)
        elif current is not None and "--hash=sha256:" in line:
            version, hashes = pins[current]
            pins[current] = (version, hashes + len(re.findall(r"--hash=sha256:[0-9a-f]{64}", line)))
    return pins


def _pyproject(path: str) -> dict[str, object]:
    return tomllib.loads((REPO / path).read_text())


def _requirements(*groups: list[str]) -> list[Requirement]:
    return [Requirement(text) for group in groups for text in group]


def _dev_in() -> list[str]:
    lines = (REPO / "requirements" / "dev.in").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def _project() -> dict[str, list[str]]:
    project = _pyproject("pyproject.toml")["project"]
    assert isinstance(project, dict)
    return {"runtime": project["dependencies"], "dev": project["optional-dependencies"]["dev"]}


@pytest.mark.parametrize("lock", ["image.lock", "dev.lock"])
def test_every_pin_carries_hashes(lock: str) -> None:
    pins = _lock(lock)
    assert pins, f"{lock} pins nothing"
    unhashed = sorted(name for name, (_, hashes) in pins.items() if hashes == 0)
    assert not unhashed, f"{lock}: pins without --hash: {unhashed}; {LOCK_HINT}"


def _check(requirements: list[Requirement], pins: dict[str, tuple[Version, int]], lock: str) -> None:
    for req in requirements:
        if req.marker is not None and not req.marker.evaluate():
            continue
        name = canonicalize_name(req.name)
        assert name in pins, f"{lock} lacks {req}; {LOCK_HINT}"
        version = pins[name][0]
        assert req.specifier.contains(version, prereleases=True), f"{lock} pins {name}=={version}, outside {req}"


def test_the_image_lock_covers_the_runtime_dependencies() -> None:
    _check(_requirements(_project()["runtime"]), _lock("image.lock"), "image.lock")


def test_the_dev_lock_covers_everything_make_venv_installs() -> None:
    project = _project()
    sandbox = _pyproject("sandbox/pyproject.toml")["project"]
    assert isinstance(sandbox, dict)
    bench = [r for r in sandbox["dependencies"] if canonicalize_name(Requirement(r).name) != "dra-driver"]
    # The bench's own requirements must be in dev.in, or pip-compile never saw them.
    dev_in = {canonicalize_name(Requirement(r).name) for r in _dev_in()}
    runtime = {canonicalize_name(Requirement(r).name) for r in project["runtime"]}
    missing = sorted(canonicalize_name(Requirement(r).name) for r in bench)
    assert not [n for n in missing if n not in dev_in | runtime], "add the bench's dependencies to requirements/dev.in"
    _check(_requirements(project["runtime"], project["dev"], bench, _dev_in()), _lock("dev.lock"), "dev.lock")


def test_one_version_of_each_package_in_both_locks() -> None:
    image, dev = _lock("image.lock"), _lock("dev.lock")
    differ = {
        name: (str(image[name][0]), str(dev[name][0]))
        for name in image
        if dev.get(name, image[name])[0] != image[name][0]
    }
    assert not differ, f"image.lock and dev.lock pin different versions (image, dev): {differ}; {LOCK_HINT}"
    assert set(image) <= set(dev), f"dev.lock lacks {sorted(set(image) - set(dev))}; {LOCK_HINT}"
