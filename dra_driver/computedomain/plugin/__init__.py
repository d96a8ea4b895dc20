"""The compute-domain kubelet plugin (`dra-driver compute-domain-kubelet-plugin`): a second DRA driver,
`compute-domain.gpu.dra.dev`, on the kubelet-plugin layer. See docs/compute-domains.md, "The compute-domain
kubelet plugin".

    checkpoint.py   its device records and claim details in the layer's checkpoint (<plugin-dir>/checkpoint.json)
    faults.py       its crash points
    hostdevices.py  the char-device majors (/proc/devices) and the fabric-management capability's minor
    domains.py      what prepare reads from the API: the ComputeDomain, its cliques, the node (label)
    cdi.py          its per-claim CDI specs
    effects/        what a claim does to the node (the layer's effect protocol): the IMEX channel, the daemon's config
                    directory, then the claim's CDI spec (effects/registry.py lists them)
    claimplan.py    planning a claim: its results, configs, domain, one device record each
    engine.py       prepare / unprepare (a `Driver` of the layer)
    recovery.py     startup recovery and the periodic cleanup
    slices.py       the node's ResourceSlice: channel-0 and daemon-0 (pure)
    app.py          assembles and runs it
"""
