"""Render an AllocationOutcome as text for people (`dra-driver explain`, logs, events)."""

from __future__ import annotations

from dra_driver.allocation.outcome import AllocationOutcome, RequestExplanation


def _request_lines(req: RequestExplanation) -> list[str]:
    head = f"  request {req.request} (class {req.device_class}, wants {req.wanted}): "
    head += f"{req.available} of {req.considered} devices on the node available"
    lines = [head]
    if req.problem:
        lines.append(f"    problem: {req.problem}")
    for reason in req.reasons:
        noun = "device" if reason.count == 1 else "devices"
        lines.append(f"    {reason.count} {noun}: {reason.reason}")
        if reason.examples:
            lines.append(f"      e.g. {', '.join(reason.examples)}")
    return lines


def explain_text(outcome: AllocationOutcome) -> str:
    """A self-contained, multi-line description of the outcome. Pure; no trailing newline."""
    if outcome.ok:
        assert outcome.allocation is not None
        lines = [f"claim {outcome.claim} can be allocated on node {outcome.node}:"]
        for result in outcome.allocation.get("devices", {}).get("results", []):
            line = f"  {result['request']} -> {result['driver']}/{result['pool']}/{result['device']}"
            extras = []
            if result.get("adminAccess"):
                extras.append("admin access")
            if result.get("shareID"):
                extras.append(f"share {result['shareID']}")
            if result.get("consumedCapacity"):
                extras.append(
                    "consumes " + ", ".join(f"{k}={v}" for k, v in sorted(result["consumedCapacity"].items()))
                )
            lines.append(line + (f" ({'; '.join(extras)})" if extras else ""))
        return "\n".join(lines)
    explanation = outcome.explanation
    assert explanation is not None
    lines = [f"claim {explanation.claim} cannot be allocated on node {explanation.node}: {explanation.summary}"]
    other_errors = [e for e in explanation.errors if e != explanation.summary]
    if other_errors:
        lines.append("errors:")
        lines.extend(f"  {e}" for e in other_errors)
    if explanation.unsatisfiable_constraints:
        lines.append("unsatisfiable constraints:")
        lines.extend(f"  {c}" for c in explanation.unsatisfiable_constraints)
    if explanation.pool_problems:
        lines.append("pools skipped:")
        lines.extend(f"  {p}" for p in explanation.pool_problems)
    if explanation.requests:
        lines.append("requests:")
        for req in explanation.requests:
            lines.extend(_request_lines(req))
    return "\n".join(lines)
