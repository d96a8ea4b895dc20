"""apps/v1 DaemonSet validation: the spec checks of kubernetes/kubernetes `pkg/apis/apps/validation/validation.go`
(`ValidateDaemonSetSpec`, `ValidateDaemonSetUpdateStrategy`, `ValidateRollingUpdateDaemonSet`,
`ValidateDaemonSetUpdate`: the selector is immutable), with upstream's messages. The pod template itself gets
only what the sandbox checks for pods (metadata); a real server also runs ValidatePodTemplateSpec.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

from .fielderrors import NOT_SUPPORTED, Errors, FieldError

_PERCENT: Final = re.compile(r"^[0-9]+%$")
STRATEGY_TYPES: Final = ("RollingUpdate", "OnDelete")


def selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """metav1.LabelSelectorAsSelector(selector).Matches(labels): a nil selector matches nothing, an empty one
    everything; matchExpressions In/NotIn/Exists/DoesNotExist."""
    if selector is None:
        return False
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for req in selector.get("matchExpressions") or []:
        key, op, values = req.get("key"), req.get("operator"), set(req.get("values") or [])
        present = key in labels
        if op == "In" and not (present and labels[key] in values):
            return False
        if op == "NotIn" and present and labels[key] in values:
            return False
        if op == "Exists" and not present:
            return False
        if op == "DoesNotExist" and present:
            return False
    return True


def _nonnegative(errs: Errors, value: object, path: str) -> None:
    # ValidateNonnegativeField's message (apimachinery's validation.InclusiveRangeError wording is not used here).
    if isinstance(value, int) and not isinstance(value, bool) and value < 0:
        errs.invalid(path, value, "must be greater than or equal to 0")


def _int_or_percent(value: object) -> int:
    if isinstance(value, str) and _PERCENT.match(value):
        return int(value[:-1])
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _int_or_percent_errors(errs: Errors, value: object, path: str) -> None:
    """ValidatePositiveIntOrPercent + IsNotMoreThan100Percent."""
    if isinstance(value, str):
        if not _PERCENT.match(value):
            errs.invalid(path, value, "a valid percent string must be a numeric string followed by an ending '%' "
                         "(e.g. '1%',  or '93%', regex used for validation is '[0-9]+%')")
        elif int(value[:-1]) > 100:
            errs.invalid(path, value, "must not be greater than 100%")
    else:
        _nonnegative(errs, value, path)


def _rolling_update(errs: Errors, rolling: Mapping[str, Any], path: str) -> None:
    """ValidateRollingUpdateDaemonSet (maxSurge GA since 1.25): exactly one of the two is non-zero."""
    unavailable, surge = rolling.get("maxUnavailable"), rolling.get("maxSurge")
    _int_or_percent_errors(errs, unavailable, f"{path}.maxUnavailable")
    _int_or_percent_errors(errs, surge, f"{path}.maxSurge")
    has_unavailable, has_surge = _int_or_percent(unavailable) != 0, _int_or_percent(surge) != 0
    if has_unavailable and has_surge:
        errs.invalid(f"{path}.maxSurge", surge, "may not be set when maxUnavailable is non-zero")
    elif not has_unavailable and not has_surge:
        errs.required(f"{path}.maxUnavailable", "cannot be 0 when maxSurge is 0")


def validate_daemon_set(obj: Mapping[str, Any]) -> list[FieldError]:
    errs = Errors()
    spec = obj.get("spec") if isinstance(obj.get("spec"), Mapping) else {}
    assert isinstance(spec, Mapping)
    selector = spec.get("selector") if isinstance(spec.get("selector"), Mapping) else None
    template = spec.get("template") if isinstance(spec.get("template"), Mapping) else {}
    assert isinstance(template, Mapping)
    labels = (template.get("metadata") or {}).get("labels") or {}
    if not selector_matches(selector, labels):
        errs.invalid("spec.template.metadata.labels", labels, "`selector` does not match template `labels`")
    if selector is not None and not (selector.get("matchLabels") or selector.get("matchExpressions")):
        errs.invalid("spec.selector", selector, "empty selector is invalid for daemonset")
    pod_spec = template.get("spec") or {}
    policy = pod_spec.get("restartPolicy") or ""
    if policy != "Always":
        errs.add("spec.template.spec.restartPolicy", NOT_SUPPORTED, 'supported values: "Always"', policy)
    if pod_spec.get("activeDeadlineSeconds") is not None:
        errs.invalid("spec.template.spec.activeDeadlineSeconds", pod_spec["activeDeadlineSeconds"],
                     "must not be specified")
    _nonnegative(errs, spec.get("minReadySeconds"), "spec.minReadySeconds")
    strategy = spec.get("updateStrategy") or {}
    kind = strategy.get("type")
    if kind == "RollingUpdate":
        if not isinstance(strategy.get("rollingUpdate"), Mapping):
            errs.required("spec.updateStrategy.rollingUpdate")
        else:
            _rolling_update(errs, strategy["rollingUpdate"], "spec.updateStrategy.rollingUpdate")
    elif kind != "OnDelete":
        errs.add("spec.updateStrategy", NOT_SUPPORTED, 'supported values: "RollingUpdate", "OnDelete"', strategy)
    _nonnegative(errs, spec.get("revisionHistoryLimit"), "spec.revisionHistoryLimit")
    return errs.items


def validate_daemon_set_update(new: Mapping[str, Any], old: Mapping[str, Any]) -> list[FieldError]:
    found = validate_daemon_set(new)
    new_sel = (new.get("spec") or {}).get("selector")
    if new_sel != (old.get("spec") or {}).get("selector"):
        found.append(FieldError("spec.selector", "FieldValueInvalid", "field is immutable", new_sel))
    return found
