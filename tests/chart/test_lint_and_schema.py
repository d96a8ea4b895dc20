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
    "nvml without preset": (("nvml=fake",), r"nvml.*\^\(real\|fake:\(a30x4\|"),
    "nvml unknown mode": (("nvml=mock:dgx",), r"nvml.*\^\(real\|fake:\(a30x4\|"),
    "nvml unknown preset": (("nvml=fake:nosuchpreset",), r"nvml.*\^\(real\|fake:\(a30x4\|dgx-a100\|dgx-h100"),
    "nvml unknown knob": ((r"nvml=fake:l4x2\,colour=red",), r"nvml.*\|clique\)=\["),
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


def test_the_schemas_fake_presets_and_knobs_are_the_fake_nvmls_own() -> None:
    """values.schema.json refuses `nvml: fake:nosuchpreset` at install time: its pattern lists exactly the presets
    the fake NVML ships and the knobs it takes (issue 38), so the list cannot drift from the code."""
    from dra_driver.nvml.factory import FAKE_KNOBS
    from dra_driver.nvml.fake.nodefile import preset_names

    pattern = json.loads((CHART / "values.schema.json").read_text())["properties"]["nvml"]["pattern"]
    match = re.fullmatch(r"\^\(real\|fake:\(([^)]*)\)\(,\\s\*\(([^)]*)\)=\[\^,\]\*\)\*\)\$", pattern)
    assert match, pattern
    assert match.group(1).split("|") == list(preset_names())
    assert match.group(2).split("|") == list(FAKE_KNOBS)
    for preset in preset_names():
        assert re.fullmatch(pattern, f"fake:{preset}") and re.fullmatch(pattern, f"fake:{preset},seed=x, mig=off")
    assert not re.fullmatch(pattern, "fake:nosuchpreset")


def test_another_driver_name_with_compute_domains_is_refused_naming_the_fix(helm: Helm) -> None:
    """The compute domains' driver and classes are fixed names (compute-domain.gpu.dra.dev): with them on (the
    default), another driverName is refused with the way out, instead of leaving them as they were."""
    message = helm.fail(["driverName=gpu.example.com"])
    assert "driverName gpu.example.com" in message
    assert "compute-domain-daemon.gpu.dra.dev" in message and "computeDomains.enabled=false" in message
    objects = helm.render(["driverName=gpu.example.com", "computeDomains.enabled=false"])
    names = [o["metadata"]["name"] for o in objects if o.get("kind") == "DeviceClass"]
    assert names and all(n.endswith("gpu.example.com") for n in names), names
    text = "\n".join(json.dumps(o) for o in objects)
    assert "compute-domain" not in text
    # What stays is no driver name: the project's API group (its CRDs, in RBAC rules) and its node annotation key.
    rest = text.replace('"apiGroups": ["gpu.dra.dev"]', "").replace("gpu.dra.dev/nvidia-driver", "")
    assert "gpu.dra.dev" not in rest
