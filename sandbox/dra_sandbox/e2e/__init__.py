"""End-to-end scenarios: a strict scenario format, its checks, and one runner for the sandbox and real clusters."""
