"""The ComputeDomain controller (issue 24; docs/compute-domains.md "The controller"): runs inside `dra-driver
controller` behind `--compute-domains`, on the leader only, as the GpuSharingPolicy reconciler does.

    objects.py   what the controller creates for a domain (pure): the two ResourceClaimTemplates, the DaemonSet
    status.py    status.nodes / status.status from the cliques, the pruning, the one-domain-per-clique rule (pure)
    binding.py   KEP-5007 binding conditions on channel claims (pure decisions)
    loop.py      the reconcile loop: API reads and writes, Events, metrics
"""
