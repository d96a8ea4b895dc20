from tests.chart.conftest import helm

__all__ = ["helm"]  # the chart tests' helm fixture: the RBAC rows are held to the rendered roles
