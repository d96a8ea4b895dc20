"""The fidelity tables (docs/sandbox.md), the CEL and allocator tables (docs/allocator.md) and the request table
(docs/reference/api-requests.md) name, per row, the test that holds the behaviour: every test and e2e scenario a
row names must exist, so a renamed or deleted test cannot leave a row claiming a guard that is gone."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ("docs/sandbox.md", "docs/allocator.md", "docs/reference/api-requests.md", "docs/consumable-capacity.md")
# `tests/a/test_x.py::test_name`, `test_x.py::test_name[param]` or `::test_name` (a row's earlier file).
TEST_REF = re.compile(r"`((?:[\w./-]*\.py)?)::(\w+)(?:\[[^\]`]*\])?`")
SCENARIO_REF = re.compile(r"\be2e (?:scenarios? )?`([a-z0-9][a-z0-9-]*)`")


@cache
def _test_sources() -> dict[Path, str]:
    return {p: p.read_text() for p in (ROOT / "tests").rglob("*.py")}


def _files_named(ref: str) -> list[Path]:
    if "/" in ref:
        return [ROOT / ref] if (ROOT / ref).is_file() else []
    return [p for p in _test_sources() if p.name == ref]


def _defines(source: str, name: str) -> bool:
    return re.search(rf"^\s*(?:async\s+)?def {re.escape(name)}\(", source, re.M) is not None


def _references() -> list[tuple[str, int, str, str]]:
    out = []
    for doc in DOCS:
        for number, line in enumerate((ROOT / doc).read_text().splitlines(), 1):
            out += [(doc, number, file, name) for file, name in TEST_REF.findall(line)]
    return out


def test_the_docs_name_tests_at_all() -> None:
    assert len(_references()) >= 80, "the tables' test column is no longer recognised: update TEST_REF"


@pytest.mark.parametrize(("doc", "line", "file", "name"), _references())
def test_every_test_a_table_names_exists(doc: str, line: int, file: str, name: str) -> None:
    candidates = _files_named(file) if file else list(_test_sources())
    assert candidates, f"{doc}:{line}: no test file {file!r}"
    assert any(_defines(_test_sources().get(p) or p.read_text(), name) for p in candidates), (
        f"{doc}:{line}: no test {name!r} in {file or 'tests/'}")


def test_every_e2e_scenario_a_table_names_exists() -> None:
    missing = [(doc, name) for doc in DOCS for name in SCENARIO_REF.findall((ROOT / doc).read_text())
               if not (ROOT / "e2e" / "scenarios" / name).is_dir()]
    assert not missing, f"scenarios named in the docs that do not exist: {missing}"
