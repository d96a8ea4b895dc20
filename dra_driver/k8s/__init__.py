"""The lowest layer of the product: the Kubernetes API client (JSON REST), Quantity and Semver values.

Everything above (CEL, the allocator, slices, the kubelet plugin, commands) may import it; it imports
nothing else of the product.
"""
