"""Hold recorded request shapes to what upstream serves (every supported minor), to the table, and to the chart's
RBAC. `python -m tests.apirequests.check <directory>` prints a directory's product shapes and what is wrong."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path

from dra_sandbox.apiserver.fieldlabels import SUPPORTED_MINORS, FieldLabelRules, builtin_rules, custom_rules
from dra_sandbox.apiserver.registry import BUILTIN_TYPES
from dra_sandbox.apiserver.shapes import RequestShape
from tests.apirequests.table import (
    CHART_COMPONENTS,
    FIELD_OPERATORS,
    ROWS,
    SAME_ACCOUNT,
    UPSTREAM_PARAMS,
    UPSTREAM_PATCH_TYPES,
    Row,
)

Rule = tuple[str, str, str]  # (API group, resource, verb), as tests/chart/test_rbac.py
BUILTIN_KINDS = {(rt.group, rt.plural) for rt in BUILTIN_TYPES}


@dataclass(frozen=True)
class Recorded:
    shape: RequestShape
    example: str
    test: str
    user_agent: str


def load(directory: Path) -> list[Recorded]:
    """The product's shapes (one example each) from every file of `directory`."""
    names = {f.name for f in fields(RequestShape)}
    out: dict[RequestShape, Recorded] = {}
    for file in sorted(directory.glob("*.jsonl")):
        for line in file.read_text(encoding="utf-8").splitlines():
            raw = json.loads(line)
            values = {k: raw[k] for k in names}
            for key in ("params",):
                values[key] = tuple(values[key])
            for key in ("field_selector", "label_selector"):
                values[key] = tuple(tuple(p) for p in values[key])
            shape = RequestShape(**values)
            if shape.component and shape not in out:
                out[shape] = Recorded(shape, raw["example"], raw["test"], raw["user_agent"])
    return list(out.values())


def field_rules(group: str, resource: str, scope: str) -> FieldLabelRules:
    plural = resource.split("/", 1)[0]
    if (group, plural) in BUILTIN_KINDS:
        return builtin_rules(group, plural)
    # The product's own CRDs (and kopf's) declare no selectableFields.
    return custom_rules(scope != "cluster", {})


def upstream_problems(shape: RequestShape) -> list[str]:
    """What a real API server of some supported minor would refuse in this shape."""
    out: list[str] = []
    if not shape.scope:  # a non-resource GET (/version, discovery): served to every client
        return out
    rules = field_rules(shape.group, shape.resource, shape.scope)
    for label, op in shape.field_selector:
        if label == "<unparseable>":
            out.append(f"field selector {op!r} does not parse")
            continue
        if op not in FIELD_OPERATORS:
            out.append(f"field selector operator {op!r} on {label}: only =, == and != exist")
        refused = [f"1.{m}" for m in SUPPORTED_MINORS if label not in rules.supported(m)]
        if refused:
            out.append(f"field selector {label}: Kubernetes {', '.join(refused)} answer 400 "
                       f"({rules.refusal.format(label=label, gvk=f'{shape.group}/{shape.version}, Kind=…')}; "
                       f"{rules.source})")
    allowed = UPSTREAM_PARAMS.get(shape.verb, frozenset())
    unknown = sorted(set(shape.params) - allowed)
    if unknown:
        out.append(f"query parameter(s) {', '.join(unknown)} are not options of a {shape.verb}")
    if shape.verb == "patch":
        plural = shape.resource.split("/", 1)[0]
        accepted = UPSTREAM_PATCH_TYPES["builtin" if (shape.group, plural) in BUILTIN_KINDS else "custom"]
        if shape.content_type not in accepted:
            out.append(f"patch content type {shape.content_type!r} is refused (415) for this kind")
    return out


def matching_row(shape: RequestShape, rows: Iterable[Row] = ROWS) -> Row | None:
    return next((r for r in rows if r.matches(shape)), None)


def rbac_rule(shape: RequestShape) -> Rule | None:
    return None if not shape.scope else (shape.group, shape.resource, shape.verb)


def problems(rec: Recorded, rows: Iterable[Row] = ROWS, granted: Mapping[str, set[Rule]] | None = None) -> list[str]:
    shape = rec.shape
    out = upstream_problems(shape)
    if matching_row(shape, rows) is None:
        out.append("no row of tests/apirequests/table.py has this shape (a new request: add a row with the "
                   "upstream file that serves it, and the docs/reference/api-requests.md line)")
    rule = rbac_rule(shape)
    if granted is not None and rule is not None and shape.component in CHART_COMPONENTS \
            and rule not in granted.get(shape.component, set()):
        group, resource, verb = rule
        out.append(f"the chart's {shape.component} role does not grant {verb} on {resource} ({group or 'core'})")
    return out


def describe(rec: Recorded) -> str:
    s = rec.shape
    selectors = ", ".join(f"{k}{op}…" for k, op in s.field_selector)
    return (f"{s.component}: {s.verb} {s.group or 'core'}/{s.version} {s.resource} [{s.scope or 'non-resource'}"
            f"{', named' if s.named else ''}] params={list(s.params)} fieldSelector=[{selectors}] "
            f"labelSelector={list(s.label_selector)} content-type={s.content_type or '-'}\n"
            f"    e.g. {rec.example}  ({rec.user_agent}; test {rec.test or '?'})")


def report(recorded: Iterable[Recorded], rows: Iterable[Row] = ROWS,
           granted: Mapping[str, set[Rule]] | None = None) -> str:
    """One paragraph per bad shape; "" when every one is fine."""
    rows = list(rows)
    lines: list[str] = []
    for rec in recorded:
        found = problems(rec, rows, granted)
        if found:
            lines.append(describe(rec))
            lines.extend(f"    - {p}" for p in found)
    return "\n".join(lines)


def chart_grants() -> dict[str, set[Rule]] | None:
    """The rendered chart's rules per component (default values), or None without helm (`make helm`)."""
    from tests.chart.helm import HELM4, Helm
    from tests.chart.test_rbac import granted

    if not HELM4.exists():
        return None
    objects = Helm(HELM4).render()
    return {c: granted(objects, c).union(*(granted(objects, o) for o in SAME_ACCOUNT.get(c, ())))
            for c in CHART_COMPONENTS}


def check_directory(directory: Path) -> tuple[int, str]:
    """(how many distinct request shapes were recorded, the report of those the table or RBAC refuses)."""
    recorded = load(directory)
    return len(recorded), (report(recorded, ROWS, chart_grants()) if recorded else "")


def main(argv: list[str]) -> int:
    recorded = load(Path(argv[1]))
    for rec in sorted(recorded, key=lambda r: (r.shape.component, r.shape.group, r.shape.resource, r.shape.verb)):
        print(describe(rec))
        for p in problems(rec, ROWS, chart_grants()):
            print(f"    - {p}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
