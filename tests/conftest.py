"""Suite-wide settings."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

# Property tests explore the same examples on every run (a failure in CI is reproducible locally); set
# DRA_TEST_FULL=1 (`make test-full`) to let hypothesis search freshly and harder.
settings.register_profile("ci", derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("full", max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("full" if os.environ.get("DRA_TEST_FULL") == "1" else "ci")

# Every request the product sends is recorded by the sandbox API servers and checked at the end of the session
# against docs/reference/api-requests.md (tests/apirequests/).
pytest_plugins = ["tests.apirequests.plugin"]
