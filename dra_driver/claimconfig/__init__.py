"""The opaque configuration API (`gpu.dra.dev/v1beta1`): strict decoding, validation and resolution.

Each part is imported from its module: the decoded types from `api`, decoding from `decode` (`decode_config`,
pydantic models) and resolution from `resolve` (`configs_for`), so that importing the types (the kubelet plugin
does at start) does not build the pydantic models; they load with the first claim that carries opaque config.
"""
