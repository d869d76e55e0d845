"""Per-client and server state, allocated from an algorithm's declaration."""
