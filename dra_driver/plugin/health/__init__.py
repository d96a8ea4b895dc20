"""Device health in the kubelet plugin: the board (current state per device), the NVML event monitor
that feeds it, and the HTTP endpoint (`/healthz`, `/metrics`)."""
