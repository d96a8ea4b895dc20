"""The chart's README documents every value; versions agree."""

from __future__ import annotations

import json
import re
from typing import Any

import yaml

import dra_driver
from tests.chart.helm import CHART, REPO


def leaf_values(values: dict[str, Any], schema: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Dotted value paths, descending only into groups the schema describes property by property."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        path = f"{prefix}{key}"
        sub = schema.get("properties", {}).get(key, {})
        if isinstance(value, dict) and "properties" in sub:
            out.update(leaf_values(value, sub, f"{path}."))
        else:
            out[path] = value
    return out


def readme_rows() -> dict[str, list[str]]:
    text = (CHART / "README.md").read_text()
    section = text.split("## Values", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        match = re.match(r"\|\s*`([^`]+)`\s*\|(.*)\|\s*$", line)
        if match:
            rows[match.group(1)] = [c.strip() for c in re.split(r"(?<!\\)\|", match.group(2))]
    return rows


def test_readme_lists_every_value_with_type_default_and_meaning() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    schema = json.loads((CHART / "values.schema.json").read_text())
    leaves = leaf_values(values, schema)
    rows = readme_rows()
    assert set(rows) == set(leaves), f"undocumented: {set(leaves) - set(rows)}; stale: {set(rows) - set(leaves)}"
    types = {str: "string", bool: "boolean", int: "integer", list: "list", dict: "map"}
    for path, value in leaves.items():
        kind, default, meaning = rows[path]
        expected_type = types[type(value)]
        if path.endswith("Seconds") and kind == "number":
            expected_type = "number"
        assert kind == expected_type, path
        if isinstance(value, bool):
            assert default == f"`{str(value).lower()}`", path
        elif isinstance(value, str | int):
            assert default == f"`{value if value != '' else chr(34) * 2}`", path
        assert len(meaning) > 10, path


def test_every_value_is_in_the_schema() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    schema = json.loads((CHART / "values.schema.json").read_text())
    for path in leaf_values(values, schema):
        node = schema
        for part in path.split("."):
            node = node["properties"][part]
        assert "type" in node, path


def test_chart_app_version_is_the_package_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    pyproject = (REPO / "pyproject.toml").read_text()
    version = re.search(r'^version = "([^"]+)"', pyproject, re.MULTILINE)
    assert version
    assert chart["apiVersion"] == "v2"
    assert chart["appVersion"] == version.group(1) == dra_driver.__version__
