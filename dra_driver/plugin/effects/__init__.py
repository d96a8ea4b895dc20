"""What a claim does to a node, one module per kind (the protocol: base.py; the kinds in order: registry.py)."""
