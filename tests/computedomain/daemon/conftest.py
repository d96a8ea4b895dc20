"""Fixtures of the IMEX daemon runner's tests (harness.py)."""

from tests.computedomain.daemon.harness import cluster

__all__ = ["cluster"]
