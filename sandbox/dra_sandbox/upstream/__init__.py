"""Upstream Kubernetes on this machine (docs/upstream.md): its programs built from their Go modules (`build`), the
control plane as local processes (`controlplane`, `pki`) and a real node (kubelet, containerd, CNI, images)."""
