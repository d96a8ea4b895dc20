"""Local single-node sandbox (fake API server, kubelet simulator, container runtime) for demos and e2e."""
