"""What a compute-domain claim does to a node, one module per kind (the GPU driver's vocabulary:
dra_driver/plugin/effects/base.py)."""
