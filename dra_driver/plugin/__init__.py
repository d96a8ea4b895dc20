"""The kubelet plugin: registration, DRA gRPC services, prepare engine, checkpoint and CDI."""
