"""The kubelet-plugin layer: what every DRA kubelet plugin needs, knowing nothing of GPUs.

A driver implements `driver.Driver` (and optionally a `driver.HealthSource`) and hands it to `server.PluginServer`,
which serves the kubelet's gRPC services (`services`) on unix sockets (`sockets`) and registers with the kubelet.
Around it: the ResourceClaim reader (`claims`), the crash-safe checkpoint store generic over the driver's record
codec (`checkpoint`), the plugin's state dirs and the node-wide operation lock (`statedirs`), the per-node publisher
lease for seamless upgrades (`publishlease`), the validation of the identities the kubelet sends (`names`) and the
KEP-5304 device metadata a `Driver` is wrapped with (`metadata`: the file and CDI mount per prepared request).
The claim engine's core, one for every driver that prepares claims through effects: the claim record, its states and
the checkpoint format over the driver's device records (`claimrecord`), the one effect protocol and the ordered
effect kinds (`effect`), and what every engine does the same way (`claimengine`).
The rules (docs/architecture.md, checked by `python -m dra_sandbox.layers`): nothing here imports the GPU driver or
its hardware, inventory, slices, CDI or claim-config packages; inside, the servicers and the server sit above the
store, the claim source and the state dirs, which import neither.
"""
