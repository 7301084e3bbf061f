"""Per-worker sharding of input pipelines (filled in by the sharding module)."""
