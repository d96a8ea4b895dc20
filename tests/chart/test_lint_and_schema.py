"""helm lint --strict, and values.schema.json rejecting bad values with a message that names the field."""

from __future__ import annotations

import json
import re

import pytest

from tests.chart.helm import CHART, Helm


def test_lint_strict(any_helm: Helm) -> None:
    proc = any_helm.run("lint", "--strict", str(CHART), check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in proc.stdout
    assert "[WARNING]" not in proc.stdout and "[ERROR]" not in proc.stdout


def test_lint_strict_with_fake_values(helm: Helm) -> None:
    proc = helm.run(
        "lint", "--strict", str(CHART), "--set", "nvml=fake:dgx-h100", "--set", "migMode=dynamic", check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_schema_is_draft07_and_forbids_unknown_keys() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    assert schema["additionalProperties"] is False


# (values, regex that helm v4 AND helm v3 both print: the field and what is allowed)
BAD_VALUES: dict[str, tuple[tuple[str, ...], str]] = {
    "nvml without preset": (("nvml=fake",), r"nvml.*\^\(real\|fake:\.\+\)\$"),
    "nvml unknown mode": (("nvml=mock:dgx",), r"nvml.*\^\(real\|fake:\.\+\)\$"),
    "migMode": (("migMode=auto",), r"migMode.*none.*static.*dynamic"),
    "logFormat": (("logFormat=xml",), r"logFormat.*json.*text"),
    "logLevel": (("logLevel=trace",), r"logLevel.*debug.*info.*warning.*error"),
    "port too high": (("healthzPort=70000",), r"healthzPort.*65,?535"),
    "port zero": (("healthzPort=0",), r"healthzPort.*\b1\b"),
    "port not a number": (("healthzPort=http",), r"healthzPort.*(integer|string)"),
    "driver name": (("driverName=GPU_Driver",), r"driverName.*pattern"),
    "relative driverRoot": (("driverRoot=run/nvidia/driver",), r"driverRoot.*pattern"),
    "pullPolicy": (("image.pullPolicy=Sometimes",), r"pullPolicy.*Always.*IfNotPresent.*Never"),
    "typo at top level": (("nvmlMode=real",), r"(?i)additional propert.*nvmlMode"),
    "typo in a group": (("deviceClasses.extendedResources=true",), r"(?i)additional propert.*extendedResources"),
    "sharing mode": (("sharing.mode=mps",), r"mode.*exclusive.*shares"),
    "share memory step": (("sharing.memoryStep=1.5G",), r"memoryStep.*pattern"),
    "share compute default": (("sharing.computeDefault=0",), r"computeDefault.*\b1\b"),
}


@pytest.mark.parametrize("case", sorted(BAD_VALUES))
def test_bad_values_rejected_with_clear_message(any_helm: Helm, case: str) -> None:
    sets, expected = BAD_VALUES[case]
    message = any_helm.fail(sets)
    assert "schema" in message, message
    assert re.search(expected, message, re.DOTALL), f"{case}: {expected!r} not in:\n{message}"


def test_existing_service_account_needs_a_name(helm: Helm) -> None:
    message = helm.fail(["serviceAccount.create=false"])
    assert "serviceAccount.name is required when serviceAccount.create is false" in message


def test_kubernetes_older_than_1_34_refused(helm: Helm) -> None:
    message = helm.fail([], kube_version="1.33.0")
    assert ">=1.34.0-0" in message
