"""docs/glossary.md names the code behind each word; every name it gives must exist, so a rename that forgets the
glossary fails here."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

GLOSSARY = Path(__file__).resolve().parents[1] / "docs" / "glossary.md"
# `dra_driver.some.module` or `dra_driver.some.module:Name`, in backticks.
REFERENCE = re.compile(r"`(dra_driver(?:\.\w+)+)(?::(\w+))?`")


def references(text: str) -> list[tuple[str, str | None]]:
    return [(m.group(1), m.group(2)) for m in REFERENCE.finditer(text)]


def missing(module: str, name: str | None) -> str | None:
    """Why the reference does not resolve; None when it does."""
    try:
        loaded = importlib.import_module(module)
    except ModuleNotFoundError:
        return f"{module}: no such module"
    if name is not None and not hasattr(loaded, name):
        return f"{module}:{name}: no such name in the module"
    return None


def test_every_code_name_in_the_glossary_exists() -> None:
    found = references(GLOSSARY.read_text(encoding="utf-8"))
    assert len(found) >= 30, "the glossary's code references were not found; did the `module:Name` form change?"
    problems = [p for module, name in found if (p := missing(module, name)) is not None]
    assert not problems, "docs/glossary.md names code that does not exist:\n" + "\n".join(problems)


@pytest.mark.parametrize(
    "reference", ["`dra_driver.resourceapi:NoSuchThing`", "`dra_driver.no_such_module`"], ids=["name", "module"]
)
def test_a_stale_reference_is_caught(reference: str) -> None:
    [(module, name)] = references(f"| word | meaning | {reference} |")
    assert missing(module, name) is not None
