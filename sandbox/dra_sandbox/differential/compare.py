"""Both sides' answers side by side: the differences, the allow-list that explains some of them, the report.

A difference's id is `sched:<case>@<shape>:<what>` (what: created, node, allocations, message, event) or
`wire:<step>`. The allow-list (tests/differential/allowlist.yaml) holds `id` patterns (fnmatch) each with a
`reason`; a difference no entry matches is *unexplained*, and the test fails on it.
"""

from __future__ import annotations

import fnmatch
import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml


@dataclass(frozen=True)
class Difference:
    id: str
    part: str  # "scheduling" or "wire"
    category: str
    sandbox: str
    upstream: str


@dataclass(frozen=True)
class Allowed:
    pattern: str
    reason: str


class AllowListError(ValueError):
    pass


def load_allow_list(path: Path) -> list[Allowed]:
    data = yaml.safe_load(path.read_text()) or []
    if not isinstance(data, list):
        raise AllowListError(f"{path}: expected a list of {{id, reason}}")
    out = []
    for i, entry in enumerate(data):
        if not isinstance(entry, dict) or not isinstance(entry.get("id"), str) or not entry["id"]:
            raise AllowListError(f"{path}: entry {i}: `id` (a difference id or fnmatch pattern) is required")
        reason = entry.get("reason")
        if not isinstance(reason, str) or len(reason.strip()) < 20:
            raise AllowListError(f"{path}: entry {i} ({entry['id']}): `reason` must say why (20 characters or more)")
        out.append(Allowed(entry["id"], " ".join(reason.split())))
    return out


def explain(difference: Difference, allowed: Sequence[Allowed]) -> Allowed | None:
    return next((a for a in allowed if fnmatch.fnmatchcase(difference.id, a.pattern)), None)


def _show(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def scheduling_differences(sandbox: Sequence[Mapping[str, Any]], upstream: Sequence[Mapping[str, Any]]
                           ) -> list[Difference]:
    theirs = {f"{v['case']}@{v['shape']}": v for v in upstream}
    out = []
    for ours in sandbox:
        key = f"{ours['case']}@{ours['shape']}"
        other = theirs.get(key)
        if other is None:
            out.append(Difference(f"sched:{key}:missing", "scheduling", ours["category"], "ran", "not run"))
            continue
        for what, value in ours["compared"].items():
            if value != other["compared"].get(what):
                out.append(Difference(f"sched:{key}:{what}", "scheduling", ours["category"], _show(value),
                                      _show(other["compared"].get(what))))
    return out


def wire_differences(sandbox: Sequence[Mapping[str, Any]], upstream: Sequence[Mapping[str, Any]]) -> list[Difference]:
    theirs = {o["id"]: o for o in upstream}
    out = []
    for ours in sandbox:
        other = theirs.get(ours["id"])
        if other is None or ours["compared"] != other["compared"]:
            out.append(Difference(f"wire:{ours['id']}", "wire", ours["row"], ours["compared"] + _message(ours),
                                  "not run" if other is None else other["compared"] + _message(other)))
    return out


def _message(outcome: Mapping[str, Any]) -> str:
    return f" — {outcome['message']}" if outcome.get("message") else ""


def differences(results: Mapping[str, Any]) -> list[Difference]:
    sched = results.get("scheduling") or {}
    wire = results.get("wire") or {}
    return (scheduling_differences(sched.get("sandbox") or [], sched.get("upstream") or [])
            + wire_differences(wire.get("sandbox") or [], wire.get("upstream") or []))


def _cell(text: str, limit: int = 400) -> str:
    text = text.replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= limit else text[:limit] + " …"


def report(results: Mapping[str, Any], found: Sequence[Difference], allowed: Sequence[Allowed]) -> str:
    """The markdown of docs/differential.md's results: per category counts, then every difference."""
    meta = results.get("meta") or {}
    lines = [f"Run: {meta.get('mode', '?')} corpus, upstream {meta.get('upstream', '?')}, sandbox "
             f"{meta.get('sandbox', '?')}; {meta.get('cases', 0)} scheduling cases x {meta.get('shapes', 0)} node "
             f"shapes = {meta.get('pods', 0)} pods, {meta.get('steps', 0)} wire requests; seconds: "
             f"{_show(meta.get('seconds', {}))}.", ""]
    lines += ["| part | category | compared | same | different (explained) | different (unexplained) |",
              "|---|---|---|---|---|---|"]
    sched = results.get("scheduling") or {}
    wire = results.get("wire") or {}
    totals: Counter[tuple[str, str]] = Counter()
    for v in sched.get("sandbox") or []:
        totals[("scheduling", v["category"])] += 1
    for o in wire.get("sandbox") or []:
        totals[("wire", o["row"])] += 1
    differing: dict[tuple[str, str], set[str]] = {}
    unexplained: dict[tuple[str, str], set[str]] = {}
    for d in found:
        unit = d.id.rsplit(":", 1)[0] if d.part == "scheduling" else d.id
        differing.setdefault((d.part, d.category), set()).add(unit)
        if explain(d, allowed) is None:
            unexplained.setdefault((d.part, d.category), set()).add(unit)
    for key in sorted(totals):
        diff = differing.get(key, set())
        bad = unexplained.get(key, set())
        lines.append(f"| {key[0]} | {key[1]} | {totals[key]} | {totals[key] - len(diff)} | {len(diff - bad)} | "
                     f"{len(bad)} |")
    lines += ["", "Every difference (sandbox, then upstream; the explanation is the allow-list's reason):", "",
              "| id | sandbox | upstream | explanation |", "|---|---|---|---|"]
    for d in found:
        why = explain(d, allowed)
        lines.append(f"| `{d.id}` | {_cell(d.sandbox)} | {_cell(d.upstream)} | "
                     f"{_cell(why.reason, 600) if why else '**NOT EXPLAINED**'} |")
    if not found:
        lines.append("| (none) | | | |")
    return "\n".join(lines) + "\n"


BEGIN = "<!-- differential results: begin (python -m dra_sandbox.differential writes this part) -->"
END = "<!-- differential results: end -->"


def write_report(doc: Path, text: str) -> None:
    """Replace the generated part of `doc` (between BEGIN and END), keeping the prose around it."""
    current = doc.read_text() if doc.exists() else f"{BEGIN}\n{END}\n"
    head, _, rest = current.partition(BEGIN)
    _, _, tail = rest.partition(END)
    doc.write_text(f"{head}{BEGIN}\n{text}{END}{tail}")
