"""The node's NVIDIA driver as both kubelet plugins see it: its state (`state.py`, one board per plugin process)
and the wait for it at start (`wait.py`). Below the GPU and compute-domain plugins, above the kubelet-plugin layer
(which knows nothing of GPUs)."""
