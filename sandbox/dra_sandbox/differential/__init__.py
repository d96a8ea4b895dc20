"""The differential suite: the same corpus sent to the sandbox (its API server and scheduler stand-in) and to upstream
kube-apiserver and kube-scheduler, and every difference reported (docs/differential.md)."""
