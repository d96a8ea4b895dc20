"""ComputeDomains: multi-node NVLink (IMEX) for GB200/GB300 NVL72 racks, as a second DRA driver
(`compute-domain.gpu.dra.dev`). See docs/compute-domains.md.

    names.py     the names every part agrees on (driver, CRDs, labels, classes, conditions, env)
    model.py     the ComputeDomain and ComputeDomainClique objects as the product reads them (pure)
"""
