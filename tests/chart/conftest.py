from __future__ import annotations

import pytest

from tests.chart.helm import HELM3, HELM4, MISSING_HINT, Helm


@pytest.fixture(scope="session")
def helm() -> Helm:
    """helm v4 (.tools/bin/helm): every chart test needs it."""
    if not HELM4.exists():
        pytest.skip(f"{HELM4} is absent: {MISSING_HINT}")
    return Helm(HELM4)


@pytest.fixture(scope="session")
def helm3() -> Helm:
    """helm v3 (.tools/bin/helm3): the chart must work with both majors."""
    if not HELM3.exists():
        pytest.skip(f"{HELM3} is absent: {MISSING_HINT}")
    return Helm(HELM3)


@pytest.fixture(scope="session", params=["helm4", "helm3"])
def any_helm(request: pytest.FixtureRequest) -> Helm:
    name = "helm" if request.param == "helm4" else "helm3"
    fixture: Helm = request.getfixturevalue(name)
    return fixture
