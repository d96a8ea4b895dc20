"""The IMEX daemon runner (`dra-driver compute-domain-daemon run|check`): docs/compute-domains.md."""
