"""The signed ledger: per-agent Ed25519 keys, hash chains, verification, export and the auditors' pages."""
