"""The lowest layer of the product: the Kubernetes API client (JSON REST), Quantity and Semver values,
and the generic name formats (DNS-1123 labels and subdomains, qualified names, label values).

Everything above (CEL, the allocator, slices, the kubelet plugin, commands) may import it; it imports
nothing else of the product but `dra_driver.errors`.
"""
